"""RocketMQ message trace records, as the 4.x/5.x Java client's TraceDataEncoder writes them.

A trace message (topic RMQ_SYS_TRACE_TOPIC unless the client configured another) is keyed by
the traced message ids and its body holds one or more contexts, each ended by \\x02, with
fields separated by \\x01:

  Pub            ts, region, group, topic, msgId, tags, keys, storeHost, bodyLength, costTime,
                 msgType ordinal [, offsetMsgId], success [, clientHost]
  SubBefore      ts, region, group, requestId, msgId, retryTimes, keys
  SubAfter       requestId, msgId, costTime, success, keys [, contextCode [, ts, group]]
  EndTransaction ts, region, group, topic, msgId, tags, keys, storeHost, msgType ordinal,
                 transactionId, transactionState, fromTransactionCheck
  Recall         ts, region, group, topic, msgId, success

Java's String.split drops trailing empty fields, so optional fields are told apart by count.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

DEFAULT_TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
CONTENT_SEP = "\x01"
FIELD_SEP = "\x02"
MESSAGE_TYPES = ("Normal_Msg", "Trans_Msg_Half", "Trans_msg_Commit", "Delay_Msg", "Order_Msg")
TRACE_TYPES = ("Pub", "Recall", "SubBefore", "SubAfter", "EndTransaction")


class TraceFormatError(ValueError):
    """A trace context that does not decode; the message says which field."""


@dataclass
class TraceContext:
    """One decoded context: what happened to one message at one client."""

    trace_type: str
    msg_id: str
    timestamp: int = 0
    region_id: str = ""
    group: str = ""
    topic: str = ""
    tags: str = ""
    keys: str = ""
    store_host: str = ""
    body_length: int = 0
    cost_time_ms: int = 0
    msg_type: str = ""
    offset_msg_id: str = ""
    success: bool = True
    client_host: str = ""
    request_id: str = ""
    retry_times: int = 0
    context_code: int = 0
    transaction_id: str = ""
    transaction_state: str = ""
    from_transaction_check: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class DecodedTrace:
    contexts: list[TraceContext] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def java_split(text: str, sep: str) -> list[str]:
    """String.split(sep) for a one-character separator: trailing empty strings removed."""
    parts = text.split(sep)
    while parts and parts[-1] == "":
        parts.pop()
    return parts


def _long(value: str, name: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise TraceFormatError(f"{name}: {value!r} is not a number") from None


def _bool(value: str) -> bool:
    return value.strip().lower() == "true"  # Boolean.parseBoolean


def _msg_type(value: str) -> str:
    i = _long(value, "msgType")
    if not 0 <= i < len(MESSAGE_TYPES):
        raise TraceFormatError(f"msgType: ordinal {i} outside 0..{len(MESSAGE_TYPES) - 1}")
    return MESSAGE_TYPES[i]


def _need(line: list[str], n: int, kind: str) -> None:
    if len(line) < n:
        raise TraceFormatError(f"{kind} context has {len(line) - 1} fields, needs at least {n - 1}")


def decode_context(text: str) -> TraceContext | None:
    """One context; None for a type this decoder (like the Java one) does not know."""
    line = java_split(text, CONTENT_SEP)
    if not line:
        return None
    kind = line[0]
    if kind == "Pub":
        _need(line, 13, kind)
        ctx = TraceContext("Pub", line[5], _long(line[1], "timestamp"), line[2], line[3], topic=line[4], tags=line[6], keys=line[7],
                           store_host=line[8], body_length=_long(line[9], "bodyLength"), cost_time_ms=_long(line[10], "costTime"),
                           msg_type=_msg_type(line[11]))
        if len(line) == 13:
            ctx.success = _bool(line[12])
        else:
            ctx.offset_msg_id, ctx.success = line[12], _bool(line[13])
            if len(line) >= 15:
                ctx.client_host = line[14]
        return ctx
    if kind == "SubBefore":
        _need(line, 8, kind)
        return TraceContext("SubBefore", line[5], _long(line[1], "timestamp"), line[2], line[3], request_id=line[4],
                            retry_times=_long(line[6], "retryTimes"), keys=line[7])
    if kind == "SubAfter":
        _need(line, 6, kind)
        ctx = TraceContext("SubAfter", line[2], request_id=line[1], cost_time_ms=_long(line[3], "costTime"),
                           success=_bool(line[4]), keys=line[5])
        if len(line) >= 7:
            ctx.context_code = _long(line[6], "contextCode")
        if len(line) >= 9:
            ctx.timestamp, ctx.group = _long(line[7], "timestamp"), line[8]
        return ctx
    if kind == "EndTransaction":
        _need(line, 13, kind)
        return TraceContext("EndTransaction", line[5], _long(line[1], "timestamp"), line[2], line[3], topic=line[4], tags=line[6],
                            keys=line[7], store_host=line[8], msg_type=_msg_type(line[9]), transaction_id=line[10],
                            transaction_state=line[11], from_transaction_check=_bool(line[12]))
    if kind == "Recall":
        _need(line, 7, kind)
        return TraceContext("Recall", line[5], _long(line[1], "timestamp"), line[2], line[3], topic=line[4], success=_bool(line[6]))
    return None


def decode(body: str) -> DecodedTrace:
    """Every context of a trace message body; a bad context is reported, the rest still read."""
    out = DecodedTrace()
    if not body:
        return out
    for i, text in enumerate(java_split(body, FIELD_SEP)):
        try:
            ctx = decode_context(text)
        except TraceFormatError as exc:
            out.problems.append(f"context {i}: {exc}")
            continue
        if ctx is not None:
            out.contexts.append(ctx)
    return out


def contexts_for(body: str, msg_id: str, born_host: str) -> DecodedTrace:
    """The contexts of `msg_id` in one trace message, as mqadmin's TraceView builds them:
    the client host is the trace message's born host unless the context names one."""
    decoded = decode(body)
    decoded.contexts = [c for c in decoded.contexts if c.msg_id == msg_id]
    for c in decoded.contexts:
        if not c.client_host:
            c.client_host = born_host
    return decoded
