"""Access control for RocketMQ 5 SDK clients, against the same accounts as quarry.v1 calls.

The SDKs sign every call (rocketmq-clients' transport spec; RocketMQ's proxy verifies the
same way):
    x-mq-date-time: 20240102T030405Z
    authorization:  MQv2-HMAC-SHA1 Credential=<access key>, SignedHeaders=x-mq-date-time, Signature=<hex>
where the signature is hex HMAC-SHA1(secret key, the x-mq-date-time value). RocketMQ checks no
clock skew on this header; Quarry does, or a header once seen would open any request forever:
x-mq-date-time must parse as yyyyMMdd'T'HHmmss'Z' and lie within a window of the server's
clock. The Java and Python SDKs write their local time marked Z (Node.js writes UTC), so by
default the window is taken around every real UTC offset (-12:00..+14:00, quarter hours);
--rmq5-date-time-zone utc narrows it to UTC when every client runs in UTC.
An unknown key, a bad signature or a date-time outside the window is UNAUTHORIZED (what the
SDKs raise for RocketMQ's own refusals); a missing topic permission is FORBIDDEN.
"""
from __future__ import annotations

import argparse
import hashlib
import hmac
import logging
import re
import time
from datetime import datetime, timezone
from typing import Callable, Iterable, Mapping

from quarry.services.log import log_event
from quarry.services.rmq5.contract import Code
from quarry.services.rmq5.status import RmqError
from quarry.services.security import Account, server_credentials
from quarry.services.settings import EnvArgumentParser

log = logging.getLogger("quarry.rmq5.auth")

SCHEME = "MQv2-HMAC-SHA1"
AUTHORIZATION = "authorization"
DATE_TIME = "x-mq-date-time"
CLIENT_ID = "x-mq-client-id"

DATE_TIME_PATTERN = re.compile(r"[0-9]{8}T[0-9]{6}Z")  # yyyyMMdd'T'HHmmss'Z', ASCII digits only
DEFAULT_WINDOW_MINUTES = 15
# Every UTC offset a time zone has (-12:00 to +14:00, all whole quarter hours), in seconds.
ANY_ZONE = tuple(range(-12 * 3600, 14 * 3600 + 1, 900))
UTC_ONLY = (0,)


def add_auth_settings(p: EnvArgumentParser) -> None:
    """The settings of a service that serves RocketMQ 5 SDKs (the commitlog and the router)."""
    p.add_setting("--rmq5-signature-window-minutes", "QUARRY_RMQ5_SIGNATURE_WINDOW_MINUTES", DEFAULT_WINDOW_MINUTES,
                  "with ACL on, a RocketMQ 5 call's signed x-mq-date-time must be within this many minutes of the server's clock "
                  "(read in the clients' zone, --rmq5-date-time-zone), or the call is refused UNAUTHORIZED; the signature covers "
                  "only that header, so a header seen on the wire opens calls while it stays inside; 15 minutes, as common "
                  "signed-request schemes allow, covers clocks kept by NTP and the SDKs' retries", int, minimum=1)
    p.add_setting("--rmq5-date-time-zone", "QUARRY_RMQ5_DATE_TIME_ZONE", "any",
                  "the zone RocketMQ 5 clients write x-mq-date-time in: any (the Java and Python SDKs write their local time "
                  "marked Z, so the window is taken around every UTC offset, -12:00 to +14:00, and a header stays usable for up "
                  "to 26 hours) or utc (every client runs in UTC, as the Node.js SDK writes and containers run: the window alone)",
                  str.lower, ["any", "utc"])


def parse_date_time(text: str) -> int:
    """Epoch seconds of an x-mq-date-time read as UTC; RmqError(UNAUTHORIZED) naming the header
    when it is not exactly yyyyMMdd'T'HHmmss'Z'."""
    if DATE_TIME_PATTERN.fullmatch(text):
        try:
            return int(datetime.strptime(text, "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc).timestamp())
        except ValueError:
            pass  # e.g. month 13: the pattern matched, the calendar did not
    raise RmqError(Code.UNAUTHORIZED, f"{DATE_TIME}: {text[:32]!r} is not a date-time of the form yyyyMMdd'T'HHmmss'Z'")


# What each MessagingService RPC needs on the topics it names (a tuple: any one of them; None:
# a valid signature only, client bookkeeping naming no topic). The servicers check exactly these
# (tests/contract/test_acl_table.py); RPCs Quarry does not serve are answered as unsupported.
PERMISSIONS: dict[str, str | tuple[str, ...] | None] = {
    "QueryRoute": ("publish", "query"), "SendMessage": "publish", "EndTransaction": "publish",
    "QueryAssignment": "query", "ReceiveMessage": "query", "AckMessage": "query", "ChangeInvisibleDuration": "query",
    "ForwardMessageToDeadLetterQueue": "query",
    "Heartbeat": None, "NotifyClientTermination": None, "Telemetry": None,
}
# RPCs that act as a consumer group: they also need the group permission "sub" on the request's
# group (the account's `groups`, else `default_group_perms`), as the RocketMQ 4 door's consumer
# requests do.
GROUP_RPCS = frozenset({"QueryAssignment", "ReceiveMessage", "AckMessage", "ChangeInvisibleDuration", "ForwardMessageToDeadLetterQueue"})


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
    """Checks a call's metadata; `accounts` None means access control is off. A signed
    x-mq-date-time is accepted within `window_s` of the clock shifted by one of `zones`
    (UTC offsets in seconds; ANY_ZONE: the SDKs' local time, wherever they run)."""

    def __init__(self, accounts: dict[str, Account] | None, window_s: float = DEFAULT_WINDOW_MINUTES * 60,
                 zones: tuple[int, ...] = ANY_ZONE, clock: Callable[[], float] = time.time) -> None:
        self.accounts = accounts
        self.window_s = window_s
        self.zones = zones
        self.clock = clock

    @classmethod
    def from_settings(cls, accounts: dict[str, Account] | None, args: argparse.Namespace) -> "Authenticator":
        """The service's authenticator (add_auth_settings); with ACL on but no TLS a WARNING says
        that anyone on the path can reuse a header seen within the window."""
        minutes = args.rmq5_signature_window_minutes
        zones = UTC_ONLY if args.rmq5_date_time_zone == "utc" else ANY_ZONE
        if accounts is not None and server_credentials() is None:
            usable = f"{minutes} minutes either side of its time" if zones is UTC_ONLY else f"up to 26 hours ({minutes} minutes around any time zone's clock)"
            log_event(log, "access control without TLS", logging.WARNING,
                      reason=f"a RocketMQ 5 authorization header signs only {DATE_TIME}, so one seen on the wire opens any call of its "
                             f"account for {usable}, and RocketMQ 4 remoting signatures carry no time at all",
                      fix="serve TLS (QUARRY_TLS_CERT, QUARRY_TLS_KEY) and keep the remoting ports on a trusted network")
        return cls(accounts, minutes * 60, zones)

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
            signed_at = parse_date_time(date_time)
            if not hmac.compare_digest(sig, signature(account.secret_key, date_time)):
                raise RmqError(Code.UNAUTHORIZED, f"authorization: bad signature for access key {access_key!r}")
            self._check_clock(date_time, signed_at)
        except RmqError as exc:
            log_event(log, "access denied", logging.WARNING, method=method, reason=exc.message)
            raise
        return account

    def _check_clock(self, date_time: str, signed_at: int) -> None:
        """RmqError(UNAUTHORIZED) when no accepted zone puts `signed_at` within the window."""
        now = self.clock()
        skew = signed_at - now
        if abs(skew) <= self.window_s or any(abs(skew - zone) <= self.window_s for zone in self.zones):
            return  # (the first test settles clients in UTC without walking the zones)
        where = " in any time zone" if len(self.zones) > 1 else ""
        server = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
        raise RmqError(Code.UNAUTHORIZED, f"{DATE_TIME}: {date_time} is outside the {self.window_s / 60:g}-minute window around this "
                                          f"server's clock ({server} UTC){where}; check the client's clock")

    def check(self, metadata: Mapping[str, str], method: str, permission: str | tuple[str, ...] | None, topics: Iterable[str] = (),
              group: str = "") -> None:
        """Authenticate, then require `permission` (or any one of several) on `topics` and, with
        `group`, "sub" on that consumer group; None: any valid account."""
        account = self.caller(metadata, method)
        if account is None or permission is None:
            return
        wanted = [t for t in topics if t]
        anyof = (permission,) if isinstance(permission, str) else permission
        if not any(account.allows(p, wanted) for p in anyof):
            why = f"access key {account.access_key} lacks {' or '.join(anyof)} permission on {', '.join(wanted) or '*'}"
            log_event(log, "access denied", logging.WARNING, method=method, access_key=account.access_key, reason=why)
            raise RmqError(Code.FORBIDDEN, why)
        if group and not account.allows_group(group):
            why = f"access key {account.access_key} lacks sub permission on group {group}"
            log_event(log, "access denied", logging.WARNING, method=method, access_key=account.access_key, reason=why)
            raise RmqError(Code.FORBIDDEN, why)
