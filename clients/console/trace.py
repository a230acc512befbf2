"""A message's trace for the message page's timeline, found as `quarry queryMsgTraceById`
finds it: a key query on the trace topic for the message id (every page), each trace message's
body decoded as RocketMQ's trace text (formats/message_trace.py), oldest context first.
"""
from __future__ import annotations

from typing import Any

from quarry.clients.errors import NotFoundError
from quarry.formats import message_trace

TRACE_PAGE = 64
MAX_PAGES = 64  # 4,096 trace messages for one id; past that the answer says it stopped


def trace(admin: Any, msg_id: str, trace_topic: str = message_trace.DEFAULT_TRACE_TOPIC, begin: int = 0, end: int = 0) -> dict[str, Any]:
    contexts: list[message_trace.TraceContext] = []
    problems: list[str] = []
    failed: dict[str, dict[str, str]] = {}
    token, pages, stopped = "", 0, ""
    while True:
        try:
            result = admin.query_by_key(trace_topic, msg_id, TRACE_PAGE, begin, end, token)
        except NotFoundError:
            return {"msgId": msg_id, "traceTopic": trace_topic, "contexts": [], "problems": [], "failedBrokers": [], "complete": True,
                    "note": f"no broker holds the trace topic {trace_topic}: tracing was not on for this message's clients"}
        pages += 1
        for m in result.messages:
            decoded = message_trace.contexts_for(m.body.decode("utf-8", errors="replace"), msg_id, m.born_host.rsplit(":", 1)[0].strip("[]"))
            contexts += decoded.contexts
            problems += [f"{m.offset_msg_id}: {p}" for p in decoded.problems]
        failed.update({b.broker_name: {"broker": b.broker_name, "code": b.error_code, "message": b.error_message} for b in result.failed_brokers})
        token = result.next_token
        if not token:
            break
        if pages >= MAX_PAGES:
            stopped = f"stopped after {pages * TRACE_PAGE} trace messages; more follow"
            break
    inferred = _place_sub_after(contexts)
    contexts.sort(key=lambda c: (c.timestamp, c.trace_type))
    return {"msgId": msg_id, "traceTopic": trace_topic, "contexts": [_context_json(c) | {"timeInferred": id(c) in inferred} for c in contexts], "problems": problems,
            "failedBrokers": list(failed.values()), "complete": not failed and not stopped, "note": stopped}


def _context_json(c: message_trace.TraceContext) -> dict[str, Any]:
    d = c.to_json()
    return {"".join(w.capitalize() if i else w for i, w in enumerate(k.split("_"))): v for k, v in d.items()}


def _place_sub_after(contexts: list[message_trace.TraceContext]) -> set[int]:
    """Older clients write a SubAfter without its time or group: on a timeline it belongs where
    its SubBefore (same request id) started plus the time consuming took. The ids of the
    contexts placed so."""
    before = {c.request_id: c for c in contexts if c.trace_type == "SubBefore" and c.request_id}
    placed = set()
    for c in contexts:
        b = before.get(c.request_id)
        if c.trace_type == "SubAfter" and not c.timestamp and b is not None:
            c.timestamp, c.group = b.timestamp + max(0, c.cost_time_ms), c.group or b.group
            placed.add(id(c))
    return placed
