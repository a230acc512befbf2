"""Telling a call that never reached its server from a server's own answer.

gRPC reports both as status codes: UNAVAILABLE is what a dead address gives, and also what
a live service may answer on purpose (e.g. an indexer whose commitlog is down). Only the
first is worth trying elsewhere or again; the second is the answer and is passed on.
"""
from __future__ import annotations

import grpc

# How gRPC core's own messages begin when the transport failed. A service's message may quote
# one later on (an indexer reporting its commitlog), so only the start is compared.
_TRANSPORT_WORDS = (
    "recvmsg:",
    "sendmsg:",
    "failed to connect",
    "connection refused",
    "connections to all backends failing",
    "socket closed",
    "connection reset",
    "broken pipe",
    "goaway",
    "dns resolution failed",
    "name resolution failure",
    "endpoint closing",
    "stream removed",
    "empty address list",
)


def transport_failure(exc: BaseException) -> bool:
    """True when `exc` is UNAVAILABLE because the call did not reach a server (or lost it)."""
    if not isinstance(exc, grpc.RpcError):
        return False
    try:
        code, details = exc.code(), (exc.details() or "")  # type: ignore[attr-defined]
    except Exception:
        return False
    if code != grpc.StatusCode.UNAVAILABLE:
        return False
    text = details.lower()
    return text.startswith(_TRANSPORT_WORDS)


def lost_connection(exc: BaseException) -> bool:
    """True when an established connection broke mid-call (a retry on a new one may help);
    False for a refused connection (the service is down: retrying only costs time)."""
    if not transport_failure(exc):
        return False
    text = (exc.details() or "").lower()  # type: ignore[attr-defined]
    return not text.startswith(("failed to connect", "connection refused", "connections to all backends failing", "dns resolution failed", "name resolution failure", "empty address list"))
