"""Access control for RocketMQ 5 SDK clients, against the same accounts as quarry.v1 calls.

The SDKs sign every call (rocketmq-clients' transport spec; RocketMQ's proxy verifies the
same way):
    x-mq-date-time: 20240102T030405Z
    authorization:  MQv2-HMAC-SHA1 Credential=<access key>, SignedHeaders=x-mq-date-time, Signature=<hex>
where the signature is hex HMAC-SHA1(secret key, the x-mq-date-time value). RocketMQ checks no
clock skew on this header (the SDKs send local time marked Z), and neither does Quarry.
An unknown key or a bad signature is UNAUTHORIZED; a missing topic permission is FORBIDDEN.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
from typing import Iterable, Mapping

from quarry.services.log import log_event
from quarry.services.rmq5.contract import Code
from quarry.services.rmq5.status import RmqError
from quarry.services.security import Account

log = logging.getLogger("quarry.rmq5.auth")

SCHEME = "MQv2-HMAC-SHA1"
AUTHORIZATION = "authorization"
DATE_TIME = "x-mq-date-time"
CLIENT_ID = "x-mq-client-id"


def signature(secret_key: str, date_time: str) -> str:
    """hex HMAC-SHA1(secret, x-mq-date-time): what the SDKs put in Signature=."""
    return hmac.new(secret_key.encode("utf-8"), date_time.encode("utf-8"), hashlib.sha1).hexdigest()


def authorization_header(access_key: str, secret_key: str, date_time: str) -> str:
    """The header an SDK sends (used by tests and the benchmark's raw clients)."""
    return f"{SCHEME} Credential={access_key}, SignedHeaders={DATE_TIME}, Signature={signature(secret_key, date_time)}"


def _parse(header: str) -> tuple[str, str]:
    """(access key, signature) of an authorization header; RmqError naming what is wrong."""
    scheme, _, rest = header.strip().partition(" ")
    if scheme != SCHEME:
        raise RmqError(Code.UNAUTHORIZED, f"authorization: scheme must be {SCHEME}, got {scheme!r}")
    items: dict[str, str] = {}
    for part in rest.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep:
            raise RmqError(Code.UNAUTHORIZED, f"authorization: expected name=value pairs, got {part.strip()!r}")
        items[name] = value
    credential, sig = items.get("Credential", ""), items.get("Signature", "")
    if not credential or not sig:
        raise RmqError(Code.UNAUTHORIZED, "authorization: Credential= and Signature= are required")
    return credential.split("/", 1)[0], sig.lower()


class Authenticator:
    """Checks a call's metadata; `accounts` None means access control is off."""

    def __init__(self, accounts: dict[str, Account] | None) -> None:
        self.accounts = accounts

    @property
    def enabled(self) -> bool:
        return self.accounts is not None

    def caller(self, metadata: Mapping[str, str], method: str) -> Account | None:
        """The authenticated account (None when ACL is off); RmqError(UNAUTHORIZED) otherwise."""
        if self.accounts is None:
            return None
        header = metadata.get(AUTHORIZATION, "")
        try:
            if not header:
                raise RmqError(Code.UNAUTHORIZED, f"authorization: missing; access control is on, sign calls with {SCHEME} (set the SDK's credentials)")
            access_key, sig = _parse(header)
            date_time = metadata.get(DATE_TIME, "")
            if not date_time:
                raise RmqError(Code.UNAUTHORIZED, f"{DATE_TIME}: missing (it is the signed content)")
            account = self.accounts.get(access_key)
            if account is None:
                raise RmqError(Code.UNAUTHORIZED, f"authorization: unknown access key {access_key!r}")
            if not hmac.compare_digest(sig, signature(account.secret_key, date_time)):
                raise RmqError(Code.UNAUTHORIZED, f"authorization: bad signature for access key {access_key!r}")
        except RmqError as exc:
            log_event(log, "access denied", logging.WARNING, method=method, reason=exc.message)
            raise
        return account

    def check(self, metadata: Mapping[str, str], method: str, permission: str | tuple[str, ...] | None, topics: Iterable[str] = ()) -> None:
        """Authenticate, then require `permission` (or any one of several) on `topics`;
        None: any valid account."""
        account = self.caller(metadata, method)
        if account is None or permission is None:
            return
        wanted = [t for t in topics if t]
        anyof = (permission,) if isinstance(permission, str) else permission
        if not any(account.allows(p, wanted) for p in anyof):
            why = f"access key {account.access_key} lacks {' or '.join(anyof)} permission on {', '.join(wanted) or '*'}"
            log_event(log, "access denied", logging.WARNING, method=method, access_key=account.access_key, reason=why)
            raise RmqError(Code.FORBIDDEN, why)
