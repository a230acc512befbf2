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
import json
import logging
from dataclasses import dataclass
from typing import Iterable

from quarry.services.log import log_event
from quarry.services.remoting import codes
from quarry.services.remoting.command import RemotingCommand
from quarry.services.remoting.server import RemotingError
from quarry.services.security import Account

log = logging.getLogger("quarry.security")

ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"
_UNSIGNED = (SIGNATURE, codes.UNIQUE_KEY_QUERY_FLAG)


@dataclass(frozen=True)
class Need:
    """What a request needs beyond a valid signature: `permission` on the topic its header field
    `topic` names ("*" when None; permission "group": no topic, only the group's), and, with
    `group`, the group permission "sub" on the consumer group that header field names. `elsewhere` says where the topics come from when no header
    holds them (the body, or a record the broker reads): the handler checks those (`require`)."""

    permission: str
    topic: str | None = None
    group: str | None = None
    elsewhere: str = ""


# Every request code served on a remoting port, and what it needs. A code missing from both
# maps is refused (tests/contract/test_acl_table.py keeps the maps and the served codes equal).
PERMISSIONS: dict[int, Need] = {
    codes.SEND_MESSAGE: Need("publish", "topic"), codes.SEND_MESSAGE_V2: Need("publish", "b"), codes.SEND_BATCH_MESSAGE: Need("publish", "b"),
    codes.END_TRANSACTION: Need("publish", elsewhere="the half message's real topic (REAL_TOPIC), read by the broker"),
    codes.PULL_MESSAGE: Need("query", "topic", "consumerGroup"), codes.QUERY_CONSUMER_OFFSET: Need("query", "topic", "consumerGroup"),
    codes.UPDATE_CONSUMER_OFFSET: Need("query", "topic", "consumerGroup"),
    codes.HEART_BEAT: Need("query", elsewhere="each consumer's subscribed topics and group, from the body"),
    codes.UNREGISTER_CLIENT: Need("query", group="consumerGroup", elsewhere="the topics the group subscribes to, as the broker knows them"),
    codes.GET_CONSUMER_LIST_BY_GROUP: Need("group", group="consumerGroup"),
    codes.CONSUMER_SEND_MSG_BACK: Need("query", group="group", elsewhere="the topic of the message sent back, read by the broker"),
    codes.LOCK_BATCH_MQ: Need("query", elsewhere="the topics of the body's queues; sub on the body's consumerGroup"),
    codes.UNLOCK_BATCH_MQ: Need("query", elsewhere="the topics of the body's queues; sub on the body's consumerGroup"),
    codes.CHECK_CLIENT_CONFIG: Need("query", elsewhere="the body's subscribed topic; sub on the body's group"),
    codes.GET_MAX_OFFSET: Need("query", "topic"), codes.GET_MIN_OFFSET: Need("query", "topic"),
    codes.SEARCH_OFFSET_BY_TIMESTAMP: Need("query", "topic"), codes.QUERY_MESSAGE: Need("query", "topic"),
    codes.QUERY_TOPIC_CONSUME_BY_WHO: Need("query", "topic"), codes.VIEW_MESSAGE_BY_ID: Need("query"),
    codes.GET_BROKER_CLUSTER_INFO: Need("query"), codes.GET_BROKER_RUNTIME_INFO: Need("query"),
    codes.GET_TOPIC_STATS_INFO: Need("query", "topic"), codes.GET_PRODUCER_CONNECTION_LIST: Need("query"),
    codes.GET_CONSUME_STATS: Need("query", group="consumerGroup",
                                  elsewhere="the header's topic, else each topic the group holds offsets for, read by the broker"),
    codes.GET_CONSUMER_CONNECTION_LIST: Need("query", group="consumerGroup", elsewhere="the topics the group's live consumers subscribe to"),
    codes.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: Need("query"), codes.GET_SYSTEM_TOPIC_LIST_FROM_NS: Need("query"),
    codes.UPDATE_AND_CREATE_TOPIC: Need("admin", "topic"),
    codes.GET_TOPIC_CONFIG: Need("query", "topic"), codes.GET_BROKER_CONFIG: Need("query"), codes.GET_ALL_TOPIC_CONFIG: Need("query"),
    codes.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: Need("query"), codes.GET_SYSTEM_TOPIC_LIST_FROM_BROKER: Need("query"),
    codes.VIEW_BROKER_STATS_DATA: Need("query", elsewhere="the topic the header's statsKey names (topic, or topic@group: then sub on the group too)"),
}
# Requests a valid signature opens: a client's bookkeeping, which names nothing it could read.
SIGNATURE_ONLY: dict[int, str] = {
    codes.GET_ROUTEINFO_BY_TOPIC: "a topic's route (which brokers hold it), asked before any send or pull",
    codes.GET_KV_CONFIG: "NameServer KV settings (none are kept: answered not found)",
    codes.GET_KV_CONFIG_BY_VALUE: "NameServer KV settings (none are kept: answered not found)",
}
ANY_TOPIC = "*"


def signature(secret_key: str, ext_fields: dict[str, str], body: bytes) -> str:
    content = "".join(ext_fields[k] for k in sorted(ext_fields) if k not in _UNSIGNED).encode("utf-8") + body
    return base64.b64encode(hmac.new(secret_key.encode("utf-8"), content, hashlib.sha1).digest()).decode("ascii")


def sign(cmd: RemotingCommand, access_key: str, secret_key: str) -> None:
    """Add AccessKey and Signature to a request (what AclClientRPCHook does)."""
    cmd.ext_fields[ACCESS_KEY] = access_key
    cmd.ext_fields.pop(SIGNATURE, None)
    cmd.ext_fields[SIGNATURE] = signature(secret_key, cmd.ext_fields, cmd.body)


class RemotingAcl:
    """The server's check: raises RemotingError(NO_PERMISSION) naming why. A request that
    passes carries its account (`cmd.caller`) for the checks its handler makes (`require`)."""

    def __init__(self, accounts: dict[str, Account]) -> None:
        self.accounts = accounts

    def __call__(self, cmd: RemotingCommand) -> None:
        access_key = cmd.ext_fields.get(ACCESS_KEY, "")
        account = self.accounts.get(access_key)
        if account is None:
            _deny(cmd, access_key, "unknown or missing AccessKey")
        given = cmd.ext_fields.get(SIGNATURE, "")
        if not hmac.compare_digest(given, signature(account.secret_key, cmd.ext_fields, cmd.body)):  # type: ignore[union-attr]
            _deny(cmd, access_key, "Signature does not match the request (HMAC-SHA1 over the sorted header fields and body)")
        assert account is not None
        cmd.caller = account  # (the checks below, and the handler's, read it)
        need = PERMISSIONS.get(cmd.code)
        if need is None:
            if cmd.code not in SIGNATURE_ONLY:
                _deny(cmd, access_key, f"request code {cmd.code} has no permission rule: refused with access control on")
            return
        if need.permission != "group" and (need.topic is not None or not need.elsewhere):
            topic = cmd.ext_fields.get(need.topic, "") if need.topic else ""
            if topic and is_retry_or_dlq(topic):
                # A group's own %RETRY%/%DLQ% topic is the group's resource (RocketMQ's
                # PlainAccessResource): pulled, committed and sent back to with its permission.
                require_group(cmd, account, topic.split("%", 2)[2])
            elif not account.allows(need.permission, [topic] if topic else []):
                _deny(cmd, access_key, f"access key {access_key} lacks {need.permission} permission on {topic or ANY_TOPIC}")
        if need.group is not None and (group := cmd.ext_fields.get(need.group, "")):
            require_group(cmd, account, group)
        if cmd.code == codes.HEART_BEAT:
            _check_heartbeat(cmd, account)


def require(cmd: RemotingCommand, permission: str, topics: Iterable[str]) -> None:
    """A handler's check of topics only it can name (a stored record's, a group's known
    subscriptions); nothing when access control is off (no caller)."""
    account = cmd.caller
    if not isinstance(account, Account):
        return
    wanted = sorted(set(topics))
    for topic in wanted:
        if is_retry_or_dlq(topic):
            require_group(cmd, account, topic.split("%", 2)[2])
        elif not account.allows(permission, [topic]):
            _deny(cmd, account.access_key, f"access key {account.access_key} lacks {permission} permission on {topic}")
    if not wanted and not account.allows(permission, []):
        _deny(cmd, account.access_key, f"access key {account.access_key} lacks {permission} permission on {ANY_TOPIC}")


def require_group_of(cmd: RemotingCommand, group: str) -> None:
    """A handler's check of a consumer group only it can name (from the body); nothing when
    access control is off."""
    if isinstance(cmd.caller, Account):
        require_group(cmd, cmd.caller, group)


def require_group(cmd: RemotingCommand, account: Account, group: str) -> None:
    if not account.allows_group(group):
        _deny(cmd, account.access_key, f"access key {account.access_key} lacks the sub permission on consumer group {group}")


def is_retry_or_dlq(topic: str) -> bool:
    """%RETRY%<group> and %DLQ%<group> belong to the group: checked by its group permission."""
    return topic.startswith(("%RETRY%", "%DLQ%"))


def _check_heartbeat(cmd: RemotingCommand, account: Account) -> None:
    """A consumer joins its group only with the group's permission and query permission on
    every topic it subscribes to (one with none needs it on "*"): otherwise anyone who can sign
    could join a group and be handed queues nobody then consumes."""
    try:
        data = json.loads(cmd.body.decode("utf-8"))
        consumers = data.get("consumerDataSet") or [] if isinstance(data, dict) else []
    except (UnicodeDecodeError, ValueError):
        return  # the handler answers a malformed body
    for consumer in consumers:
        if not isinstance(consumer, dict):
            continue
        group = str(consumer.get("groupName") or "")
        if group:
            require_group(cmd, account, group)
        subs = consumer.get("subscriptionDataSet") or []
        require(cmd, "query", [str(s.get("topic")) for s in subs if isinstance(s, dict) and s.get("topic")])


def _deny(cmd: RemotingCommand, access_key: str, why: str) -> None:
    log_event(log, "access denied", logging.WARNING, request_code=cmd.code, access_key=access_key or "-", reason=why)
    raise RemotingError(codes.NO_PERMISSION, why)
