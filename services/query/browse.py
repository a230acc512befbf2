"""Browse a topic by store time across brokers (printMsg / printMsgByQueue), and
search-offset-by-time on one broker's queue. Orchestration only: brokers' commitlogs walk
their queues, `browse_pages` merges and keeps the token."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from quarry.formats import tag_expression
from quarry.v1 import commitlog_pb2, common_pb2
from quarry.services.query.browse_pages import (BadBrowseTokenError, BrokerPlace, BrowseToken, browse_digest, decode_token, encode_token, expired_note,
                                                expired_ranges, merge_page)
from quarry.services.query.fanout import BrokerCall, Outcome
from quarry.services.errors import InvalidArgument, NotFound
from quarry.services.query.queries import Answer, Queries, _check_topic, _raise_unless_ok, _timeout_s, missing_outcome
from quarry.services.query.registry import Broker, UnknownBrokerError

DEFAULT_PAGE = 64
MAX_PAGE = 1024


@dataclass
class BrowseAnswer(Answer):
    """A browse page, with what of the window retention deleted on each broker."""

    expired: list[common_pb2.ExpiredRange] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        # Deleted messages are missing as surely as a silent broker's (though no retry helps).
        return super().complete and not self.expired


async def browse_topic(q: Queries, topic: str, begin: int, end: int, tags: str, oldest_first: bool, max_num: int, token_text: str,
                 timeout_ms: int = 0, broker_name: str = "", queue_id: int | None = None) -> BrowseAnswer:
    """One page of the topic's messages stored in [begin, end] (see BrowseTopic in router.proto)."""
    _check_topic(topic)
    timeout_s = _timeout_s(timeout_ms, q.settings)
    try:
        tag_expression.parse(tags)
    except tag_expression.TagExpressionError as exc:
        raise InvalidArgument(str(exc)) from exc
    if not 0 <= max_num <= MAX_PAGE:
        raise InvalidArgument(f"max_num: must be 0..{MAX_PAGE} (0 means {DEFAULT_PAGE})")
    max_num = max_num or DEFAULT_PAGE
    if begin < 0:
        raise InvalidArgument("begin_timestamp: must be >= 0")
    if end < 0:
        raise InvalidArgument("end_timestamp: must be >= 0 (0 means now)")
    if queue_id is not None and queue_id < 0:
        raise InvalidArgument("queue_id: must be >= 0")
    if queue_id is not None and not broker_name:
        raise InvalidArgument("queue_id: needs broker_name (a queue id names a queue of one broker)")
    digest = browse_digest(topic, begin, end, tags.strip(), oldest_first, broker_name, queue_id)
    notes: list[str] = []
    if token_text:
        try:
            token = decode_token(token_text, digest)
        except BadBrowseTokenError as exc:
            raise InvalidArgument(str(exc)) from exc
    else:
        resolved_end = end or q.clock_ms()
        if resolved_end < begin:
            raise InvalidArgument(f"end_timestamp: must be >= begin_timestamp ({begin})")
        if broker_name:
            try:
                brokers = [q.registry.get(broker_name)]
            except UnknownBrokerError as exc:
                raise NotFound(f"broker_name: {exc}") from exc
        else:
            brokers = q._holding(topic)
        token = BrowseToken(digest, resolved_end, {b.name: BrokerPlace() for b in brokers})
    known = {b.name: b for b in q.registry.known()}
    asking = [name for name, place in sorted(token.brokers.items()) if not place.finished]
    if token_text and not broker_name:
        joined = sorted(b.name for b in q.registry.holding(topic) if b.name not in token.brokers)
        if joined:
            notes.append(f"brokers that joined after the first page are not in this browse: {', '.join(joined)} (start again to include them)")
    calls: dict[str, BrokerCall[commitlog_pb2.BrowseMessagesResponse]] = {}
    missing: list[Outcome] = []
    for name in asking:
        broker = known.get(name)
        if broker is None:
            missing.append(Outcome(key=name, error_code="UNAVAILABLE", error_message=f"broker {name} is no longer registered"))
            continue
        if broker.missing:  # stopped heartbeating: reported, not asked
            missing.append(missing_outcome(broker, q.clock_ms()))
            continue
        calls[name] = _browse_call(q, broker, topic, begin, token.end, tags, oldest_first, max_num, token.brokers[name], queue_id)
    outcomes = await q.fanout.run(calls, timeout_s, timeout_s) if calls else []
    if broker_name and queue_id is not None and outcomes and outcomes[0].error_code in ("NOT_FOUND", "INVALID_ARGUMENT"):
        _raise_unless_ok(outcomes[0], known[broker_name])
    answers = {o.key: o.answer() for o in outcomes if o.ok}
    page = merge_page(answers, token, max_num, oldest_first)
    expired = expired_ranges(answers)
    notes += [expired_note(gone) for gone in expired]
    for o in outcomes:
        if o.ok:
            counted: Outcome[Any] = o  # outcome counts are of messages
            counted.value = list(o.answer().messages)
    return BrowseAnswer(messages=page.messages, outcomes=outcomes + missing, begin=begin, end=token.end, notes=notes,
                        next_token=encode_token(page.token) if page.more else "", expired=expired)


def _browse_call(q: Queries, broker: Broker, topic: str, begin: int, end: int, tags: str, oldest_first: bool, max_num: int,
                 place: BrokerPlace, queue_id: int | None) -> BrokerCall[commitlog_pb2.BrowseMessagesResponse]:
    stub = q.clients.commitlog(broker.commitlog_addr)
    request = commitlog_pb2.BrowseMessagesRequest(
        topic=topic, begin_timestamp=begin, end_timestamp=end, tag_expression=tags, oldest_first=oldest_first, max_count=max_num,
        cursors=[commitlog_pb2.QueueCursor(topic=t, queue_id=i, next_offset=o) for (t, i), o in sorted(place.cursors.items())],
        done=[commitlog_pb2.QueueCursor(topic=t, queue_id=i) for t, i in sorted(place.done)],
        queue_ids=[queue_id] if queue_id is not None else [],
    )
    return lambda t: stub.BrowseMessages(request, timeout=t)


async def search_offset(q: Queries, topic: str, broker_name: str, queue_id: int, timestamp: int, boundary: int, timeout_ms: int = 0) -> tuple[commitlog_pb2.SearchOffsetByTimeResponse, Outcome]:
    """RocketMQ's admin searchOffset on one broker's queue."""
    _check_topic(topic)
    if queue_id < 0:
        raise InvalidArgument("queue_id: must be >= 0")
    if timestamp < 0:
        raise InvalidArgument("timestamp: must be >= 0 (epoch milliseconds)")
    if boundary not in (common_pb2.BOUNDARY_TYPE_UNSPECIFIED, common_pb2.BOUNDARY_TYPE_LOWER, common_pb2.BOUNDARY_TYPE_UPPER):
        raise InvalidArgument(f"boundary: unknown value {boundary}")
    broker = q.named_broker(broker_name)
    stub = q.clients.commitlog(broker.commitlog_addr)
    request = commitlog_pb2.SearchOffsetByTimeRequest(topic=topic, queue_id=queue_id, timestamp=timestamp, boundary=boundary)  # type: ignore[arg-type]
    outcome = await q.one_broker_call(broker, lambda t: stub.SearchOffsetByTime(request, timeout=t), timeout_ms)
    return outcome.answer(), outcome
