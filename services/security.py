"""Server-side TLS and access control, both off unless configured (environment):

  QUARRY_TLS_CERT, QUARRY_TLS_KEY   serve TLS with this certificate and key
  QUARRY_TLS_CLIENT_CA              also require client certificates signed by this CA (mTLS)
  QUARRY_ACL_FILE                   JSON accounts; every RPC but health/reflection is checked

ACL file: {"accounts": [{"access_key": "...", "secret_key": "...", "admin": false,
           "topics": {"OrderTopic": ["publish", "query"], "*": ["query"]},
           "groups": {"OrderGroup": ["sub"]}, "default_group_perms": ["sub"]}]}
(groups: the consumer groups the account may consume as, RocketMQ's groupPerms; a group not
named gets default_group_perms, ["sub"] unless set, [] to deny)
A call carries x-quarry-access-key, x-quarry-timestamp (epoch ms, within 5 minutes),
x-quarry-nonce and x-quarry-signature = hex HMAC-SHA256(secret,
"<method>\\n<timestamp>\\n<access key>\\n<nonce>\\n<sha256 hex of the serialized request>"),
so a signature opens only the request it was made for. A streamed request signs "stream" in
place of the digest and each message carries its own signature in its `signature` field,
chained to the call's (quarry.signing.sign_stream_item). Each call signature is
accepted once (ReplayGuard). Unknown key, bad signature, stale timestamp or a replay →
UNAUTHENTICATED; a missing permission → PERMISSION_DENIED. Secrets and signatures are never
logged.
"""
from __future__ import annotations

import hmac
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import grpc

from quarry.signing import (
    ACCESS_KEY_HEADER, NONCE_HEADER, SIGNATURE_HEADER, STREAMED, TIMESTAMP_HEADER, request_digest, sign, sign_stream_item,
)
from quarry.services.log import log_event
from quarry.services.settings import StartupError
from quarry.services.replay_guard import ReplayGuard

log = logging.getLogger("quarry.security")
MAX_SKEW_MS = 5 * 60 * 1000

# Which permission each RPC needs. Topic-less reads need the permission on "*".
PERMISSIONS = {
    "SendMessage": "publish", "SendBatch": "publish", "SendStream": "publish", "GetTopicRoute": "publish",
    "ViewMessage": "query", "GetMessages": "query", "PullMessages": "query", "QueryMessage": "query",
    "QueryMsgByKey": "query", "QueryMsgByUniqueKey": "query", "QueryMsgById": "query", "QueryMsgByOffset": "query",
    "ListTopics": "query", "ListBrokers": "query", "ConsumeStatus": "query", "TrackMessage": "query",
    "BrowseTopic": "query", "BrowseMessages": "query", "SearchOffset": "query", "SearchOffsetByTime": "query",
    "RegisterBroker": "admin", "UnregisterBroker": "admin", "Tail": "admin", "GetStoreStatus": "admin", "GetIndexStatus": "admin",
    "GetConsumerProgress": "admin",  # every group's offsets, as GetStoreStatus every topic's
    # Key hashes of every topic an indexer holds: a topic-less read, so query on "*".
    "WatchKeyPresence": "query",
}
# Not checked here: health and reflection are open; RocketMQ 5's MessagingService carries its
# own signature (MQv2-HMAC-SHA1) and answers refusals in-band, so it checks the same accounts
# itself (quarry.services.rmq5.auth).
OPEN_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.", "/apache.rocketmq.v2.MessagingService/")


def _read_setting_file(env: str) -> bytes:
    path = os.environ.get(env, "")
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise StartupError(f"{env}={path}: cannot read it: {exc.strerror or exc}") from None


def server_credentials() -> grpc.ServerCredentials | None:
    """TLS credentials from the environment; a missing or unreadable file is a StartupError
    naming the variable (TLS never silently off because one of the pair is missing)."""
    cert, key = os.environ.get("QUARRY_TLS_CERT"), os.environ.get("QUARRY_TLS_KEY")
    if not cert and not key:
        return None
    if not cert or not key:
        raise StartupError("QUARRY_TLS_CERT and QUARRY_TLS_KEY: set both (certificate and key) or neither")
    client_ca = os.environ.get("QUARRY_TLS_CLIENT_CA")
    return grpc.ssl_server_credentials(
        [(_read_setting_file("QUARRY_TLS_KEY"), _read_setting_file("QUARRY_TLS_CERT"))],
        root_certificates=_read_setting_file("QUARRY_TLS_CLIENT_CA") if client_ca else None,
        require_client_auth=bool(client_ca),
    )


# A consumer group's permission when the account names none (RocketMQ's defaultGroupPerm, as its
# shipped plain_acl.yml sets it): joining a group also needs query on its topics.
DEFAULT_GROUP_PERMS = frozenset({"sub"})


@dataclass
class Account:
    access_key: str
    secret_key: str
    admin: bool = False
    topics: dict[str, set[str]] = field(default_factory=dict)
    groups: dict[str, set[str]] = field(default_factory=dict)  # consumer group -> {"sub"} (empty: denied)
    default_group_perms: frozenset[str] = DEFAULT_GROUP_PERMS

    def allows_group(self, group: str, permission: str = "sub") -> bool:
        """Whether the account may consume as `group` (join it, pull and commit for it)."""
        return self.admin or permission in self.groups.get(group, self.default_group_perms)

    def allows(self, permission: str, topics: Iterable[str]) -> bool:
        if self.admin:
            return True
        if permission == "admin":
            return False
        wanted = list(topics) or ["*"]
        return all(permission in self.topics.get(t, set()) or permission in self.topics.get("*", set()) for t in wanted)


def load_accounts(path: str) -> dict[str, Account]:
    data = json.loads(Path(path).read_text())
    accounts = {}
    for a in data["accounts"]:
        accounts[a["access_key"]] = Account(
            a["access_key"], a["secret_key"], bool(a.get("admin", False)), {t: set(p) for t, p in a.get("topics", {}).items()},
            {g: set(p) for g, p in a.get("groups", {}).items()}, frozenset(a.get("default_group_perms", DEFAULT_GROUP_PERMS)),
        )
    return accounts


def _topics(request: Any) -> list[str]:
    if hasattr(request, "topic") and request.topic:
        return [request.topic]
    if hasattr(request, "message") and request.HasField("message"):
        return [request.message.topic]
    if hasattr(request, "messages"):
        return sorted({m.topic for m in request.messages})
    return []


def _carries_no_topic(request_type: Any) -> bool:
    """Whether a request type has none of the fields `_topics` reads (its calls are checked on "*")."""
    fields = getattr(getattr(request_type, "DESCRIPTOR", None), "fields_by_name", None)
    return fields is not None and not {"topic", "message", "messages"} & set(fields)


@dataclass
class _Caller:
    """Who a call comes from, and what its method needs; `denied` is set when authentication failed."""

    method: str
    access_key: str
    account: Account | None
    permission: str
    timestamp_ms: int = 0
    nonce: str = ""
    signature: str = ""
    denied: tuple[grpc.StatusCode, str] | None = None


UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED


class _AclRules:
    """Authentication and permission checks (the interceptor below applies them).

    Three steps: `authenticate` (headers only: key, timestamp), then once the request is
    read `verify` (the signature over the request's digest, accepted once), and for a
    streamed request `verify_item` on each message; `refusal` checks the permission."""

    def __init__(self, accounts: dict[str, Account], clock_ms: Callable[[], int] | None = None) -> None:
        self.accounts = accounts
        self.clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self.replays = ReplayGuard(MAX_SKEW_MS, self.clock_ms)

    def authenticate(self, details: grpc.HandlerCallDetails) -> _Caller | None:
        """None for open services (health, reflection)."""
        method = details.method
        if method.startswith(OPEN_SERVICES):
            return None
        md = dict(details.invocation_metadata or ())
        access_key = md.get(ACCESS_KEY_HEADER, "")
        caller = _Caller(method, access_key, self.accounts.get(access_key), PERMISSIONS.get(method.rsplit("/", 1)[-1], "admin"))
        if caller.account is None:
            return self._deny(caller, UNAUTHENTICATED, "unknown or missing access key")
        try:
            caller.timestamp_ms = int(md.get(TIMESTAMP_HEADER, ""))
        except ValueError:
            return self._deny(caller, UNAUTHENTICATED, f"{TIMESTAMP_HEADER}: missing or not epoch milliseconds")
        if abs(self.clock_ms() - caller.timestamp_ms) > MAX_SKEW_MS:
            return self._deny(caller, UNAUTHENTICATED, f"{TIMESTAMP_HEADER}: stale (more than 5 minutes from the server clock)")
        caller.nonce = md.get(NONCE_HEADER, "")
        caller.signature = md.get(SIGNATURE_HEADER, "")
        if not caller.nonce or not caller.signature:
            return self._deny(caller, UNAUTHENTICATED, f"{NONCE_HEADER} and {SIGNATURE_HEADER} are required")
        return caller

    def verify(self, caller: _Caller, digest: str) -> str | None:
        """Why the call's signature is refused for a request with this digest (or STREAMED), or None."""
        assert caller.account is not None
        expected = sign(caller.account.secret_key, caller.method, caller.timestamp_ms, caller.access_key, caller.nonce, digest)
        if not hmac.compare_digest(caller.signature, expected):
            return self._log_denied(caller, "bad signature (not made by this key for this method and request)")
        if not self.replays.first_use(caller.signature, caller.timestamp_ms):
            return self._log_denied(caller, "replayed signature (each signed call is accepted once)")
        return None

    def verify_item(self, caller: _Caller, index: int, message: Any) -> str | None:
        """Why the `index`-th message of a streamed call is refused, or None."""
        assert caller.account is not None
        signature = getattr(message, "signature", None)
        if signature is None:
            return self._log_denied(caller, "this streamed request type cannot carry a signature")
        if not hmac.compare_digest(signature, sign_stream_item(caller.account.secret_key, caller.signature, index, message)):
            return self._log_denied(caller, f"bad signature on streamed message {index}")
        return None

    def _log_denied(self, caller: _Caller, why: str) -> str:
        log_event(log, "access denied", logging.WARNING, method=caller.method, access_key=caller.access_key or "-", reason=why)
        return why

    def _deny(self, caller: _Caller, code: grpc.StatusCode, why: str) -> _Caller:
        self._log_denied(caller, why)
        caller.denied = (code, why)
        return caller

    @staticmethod
    def refusal(caller: _Caller, request: Any) -> str | None:
        """Why `caller` may not make this request (PERMISSION_DENIED), or None."""
        assert caller.account is not None
        topics = _topics(request)
        if caller.account.allows(caller.permission, topics):
            return None
        log_event(log, "access denied", logging.WARNING, method=caller.method, access_key=caller.access_key, reason=f"no {caller.permission} permission on {topics or ['*']}")
        return f"access key {caller.access_key} lacks {caller.permission} permission on {', '.join(topics) or '*'}"


class _Digests:
    """The request deserializer of one call, wrapped to keep the SHA-256 of the bytes received."""

    def __init__(self, deserializer: Callable[[bytes], Any] | None) -> None:
        self.inner = deserializer
        self.last = ""

    def __call__(self, raw: bytes) -> Any:
        self.last = request_digest(raw)
        return self.inner(raw) if self.inner is not None else raw


class AioAclInterceptor(grpc.aio.ServerInterceptor):
    """Authenticates every call, binds its signature to the request, and checks its permission
    on the request's topics. For the services' asyncio servers: handlers are coroutines and
    async generators.

    A caller that failed authentication is refused before its requests are read, with a
    handler of the method's own shape (or a unary one for an unknown method, so it learns
    nothing about which methods exist); every call shape is wrapped, none passes unchecked."""

    def __init__(self, accounts: dict[str, Account], clock_ms: Callable[[], int] | None = None) -> None:
        self.rules = _AclRules(accounts, clock_ms)

    async def intercept_service(self, continuation: Callable, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        rules = self.rules
        caller = rules.authenticate(details)
        if caller is None:
            return await continuation(details)
        handler = await continuation(details)
        if caller.denied is not None:
            return _aio_refusing_handler(handler, *caller.denied)
        if handler is None:
            return handler
        digests = _Digests(handler.request_deserializer)

        async def check(request: Any, context: grpc.aio.ServicerContext) -> None:
            if (why := rules.verify(caller, digests.last)) is not None:
                await context.abort(UNAUTHENTICATED, why)
            if (why := rules.refusal(caller, request)) is not None:
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, why)

        request_type: Any = getattr(handler.request_deserializer, "__self__", None)  # a message class, or None
        topic_less = request_type is not None and _carries_no_topic(request_type)

        async def opened(context: grpc.aio.ServicerContext) -> None:
            # A streamed call's own checks, before its handler runs: a handler may send before
            # it reads a request (the key presence watch sends its snapshot first).
            if (why := rules.verify(caller, STREAMED)) is not None:
                await context.abort(UNAUTHENTICATED, why)
            if topic_less and (why := rules.refusal(caller, request_type())) is not None:
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, why)

        async def guarded(request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
            index = 0
            async for req in request_iterator:
                if (why := rules.verify_item(caller, index, req)) is not None:
                    await context.abort(UNAUTHENTICATED, why)
                if (why := rules.refusal(caller, req)) is not None:
                    await context.abort(grpc.StatusCode.PERMISSION_DENIED, why)
                index += 1
                yield req

        des, ser = handler.request_deserializer, handler.response_serializer
        if handler.unary_unary is not None:
            uu = handler.unary_unary

            async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                await check(request, context)
                return await uu(request, context)

            return grpc.unary_unary_rpc_method_handler(unary_unary, digests, ser)
        if handler.unary_stream is not None:
            us = handler.unary_stream

            async def unary_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
                await check(request, context)
                async for item in us(request, context):
                    yield item

            return grpc.unary_stream_rpc_method_handler(unary_stream, digests, ser)
        if handler.stream_unary is not None:
            su = handler.stream_unary

            async def stream_unary(request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
                await opened(context)
                return await su(guarded(request_iterator, context), context)

            return grpc.stream_unary_rpc_method_handler(stream_unary, des, ser)
        if handler.stream_stream is not None:
            ss = handler.stream_stream

            async def stream_stream(request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
                await opened(context)
                async for item in ss(guarded(request_iterator, context), context):
                    yield item

            return grpc.stream_stream_rpc_method_handler(stream_stream, des, ser)
        return _aio_refusing_handler(handler, grpc.StatusCode.PERMISSION_DENIED, "call shape not covered by access control")


def _aio_refusing_handler(handler: grpc.RpcMethodHandler | None, code: grpc.StatusCode, why: str) -> grpc.RpcMethodHandler:
    """A handler of `handler`'s shape that aborts at once, reading no request."""
    async def refuse(_request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code, why)

    async def refuse_stream(_request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code, why)
        yield  # pragma: no cover - makes this an async generator

    des = handler.request_deserializer if handler is not None else None
    ser = handler.response_serializer if handler is not None else None
    if handler is not None and handler.response_streaming:
        maker = grpc.stream_stream_rpc_method_handler if handler.request_streaming else grpc.unary_stream_rpc_method_handler
        return maker(refuse_stream, des, ser)
    if handler is not None and handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse, des, ser)
    return grpc.unary_unary_rpc_method_handler(refuse, des, ser)


def aio_acl_interceptors() -> list[grpc.aio.ServerInterceptor]:
    accounts = configured_accounts()
    return [AioAclInterceptor(accounts)] if accounts is not None else []


def configured_accounts() -> dict[str, Account] | None:
    """The accounts of QUARRY_ACL_FILE, or None when access control is off."""
    path = os.environ.get("QUARRY_ACL_FILE")
    if not path:
        return None
    try:
        accounts = load_accounts(path)
    except OSError as exc:
        raise StartupError(f"QUARRY_ACL_FILE={path}: cannot read it: {exc.strerror or exc}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StartupError(f"QUARRY_ACL_FILE={path}: not an accounts file ({{\"accounts\": [{{\"access_key\", \"secret_key\", ...}}]}}): {exc!r}") from None
    log_event(log, "access control on", accounts=len(accounts))
    return accounts
