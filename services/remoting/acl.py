"""RocketMQ 4's ACL signature for remoting requests, checked against Quarry's accounts.

The client puts AccessKey (and its header fields) in extFields and signs: the values of
every extFields entry but Signature and the unique-key query flag, in key order, as UTF-8,
then the body; HMAC-SHA1 with the secret key, Base64 (RocketMQ's AclUtils and the broker's
PlainAccessValidator). Accounts and topic permissions are the ones of services/security.py.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import logging

from quarry.services.log import log_event
from quarry.services.remoting import codes
from quarry.services.remoting.command import RemotingCommand
from quarry.services.remoting.server import RemotingError
from quarry.services.security import Account

log = logging.getLogger("quarry.security")

ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"
_UNSIGNED = (SIGNATURE, codes.UNIQUE_KEY_QUERY_FLAG)

# Permission each request needs and the header field naming its topic (None: topic-less,
# checked on "*"). Requests not listed only need a valid signature (client bookkeeping).
PERMISSIONS: dict[int, tuple[str, str | None]] = {
    codes.SEND_MESSAGE: ("publish", "topic"), codes.SEND_MESSAGE_V2: ("publish", "b"), codes.SEND_BATCH_MESSAGE: ("publish", "b"),
    codes.PULL_MESSAGE: ("query", "topic"), codes.QUERY_CONSUMER_OFFSET: ("query", "topic"),
    codes.UPDATE_CONSUMER_OFFSET: ("query", "topic"), codes.GET_MAX_OFFSET: ("query", "topic"),
    codes.GET_MIN_OFFSET: ("query", "topic"), codes.SEARCH_OFFSET_BY_TIMESTAMP: ("query", "topic"),
    codes.QUERY_MESSAGE: ("query", "topic"), codes.VIEW_MESSAGE_BY_ID: ("query", None),
    codes.GET_BROKER_CLUSTER_INFO: ("query", None), codes.UPDATE_AND_CREATE_TOPIC: ("admin", "topic"), codes.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: ("query", None),
}


def signature(secret_key: str, ext_fields: dict[str, str], body: bytes) -> str:
    content = "".join(ext_fields[k] for k in sorted(ext_fields) if k not in _UNSIGNED).encode("utf-8") + body
    return base64.b64encode(hmac.new(secret_key.encode("utf-8"), content, hashlib.sha1).digest()).decode("ascii")


def sign(cmd: RemotingCommand, access_key: str, secret_key: str) -> None:
    """Add AccessKey and Signature to a request (what AclClientRPCHook does)."""
    cmd.ext_fields[ACCESS_KEY] = access_key
    cmd.ext_fields.pop(SIGNATURE, None)
    cmd.ext_fields[SIGNATURE] = signature(secret_key, cmd.ext_fields, cmd.body)


class RemotingAcl:
    """The server's check: raises RemotingError(NO_PERMISSION) naming why."""

    def __init__(self, accounts: dict[str, Account]) -> None:
        self.accounts = accounts

    def __call__(self, cmd: RemotingCommand) -> None:
        access_key = cmd.ext_fields.get(ACCESS_KEY, "")
        account = self.accounts.get(access_key)
        if account is None:
            self._deny(cmd, access_key, "unknown or missing AccessKey")
        given = cmd.ext_fields.get(SIGNATURE, "")
        if not hmac.compare_digest(given, signature(account.secret_key, cmd.ext_fields, cmd.body)):  # type: ignore[union-attr]
            self._deny(cmd, access_key, "Signature does not match the request (HMAC-SHA1 over the sorted header fields and body)")
        need = PERMISSIONS.get(cmd.code)
        if need is None:
            return
        permission, topic_field = need
        topic = cmd.ext_fields.get(topic_field, "") if topic_field else ""
        if not account.allows(permission, [topic] if topic else []):  # type: ignore[union-attr]
            self._deny(cmd, access_key, f"access key {access_key} lacks {permission} permission on {topic or '*'}")

    @staticmethod
    def _deny(cmd: RemotingCommand, access_key: str, why: str) -> None:
        log_event(log, "access denied", logging.WARNING, request_code=cmd.code, access_key=access_key or "-", reason=why)
        raise RemotingError(codes.NO_PERMISSION, why)
