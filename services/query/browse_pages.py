"""Pages of a topic browse across brokers: merge in store-time order, and the token saying
where every queue of every broker stands.

Each broker answers its own next messages in the browse order (at most a page) and says which
of its queues have nothing after them. A message may enter the page only when no broker that
still has more could hold an earlier one: the page stops at the smallest last key of those
brokers. The token keeps, per broker, the next queue offset of each queue read so far and the
queues finished; a broker that did not answer keeps its place, so sending the same token again
retries the page.

A broker whose retention deleted records the window may hold says what is gone (`expired`): the
page is incomplete and no retry brings them back, so the browse goes on and names the range.
"""
from __future__ import annotations

import base64
import hashlib
import json
import zlib
from dataclasses import dataclass, field

from quarry.v1 import commitlog_pb2, common_pb2
from quarry.services.query.queries import iso_ms

QueueKey = tuple[str, int]  # (topic of the queue, queue id)
MAX_PAGE_BYTES = 32 * 1024 * 1024
NOTED_QUEUES = 8  # queues named in an expired-range note; the field lists them all


class BadBrowseTokenError(ValueError):
    """A token that does not decode or belongs to another browse."""


@dataclass
class BrokerPlace:
    """Where one broker's part of the browse stands."""

    cursors: dict[QueueKey, int] = field(default_factory=dict)
    done: set[QueueKey] = field(default_factory=set)
    finished: bool = False


@dataclass
class BrowseToken:
    digest: str
    end: int  # the window's end as resolved on the first page ("now" stays the same instant)
    brokers: dict[str, BrokerPlace] = field(default_factory=dict)


def browse_digest(topic: str, begin: int, end: int, tags: str, oldest_first: bool, broker: str, queue_id: int | None) -> str:
    text = "\x00".join(map(str, (topic, begin, end, tags, oldest_first, broker, queue_id)))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def encode_token(token: BrowseToken) -> str:
    raw = {
        "d": token.digest, "e": token.end,
        "b": {name: {"c": sorted([t, q, o] for (t, q), o in p.cursors.items()), "x": sorted([t, q] for t, q in p.done), "f": p.finished}
              for name, p in sorted(token.brokers.items())},
    }
    packed = zlib.compress(json.dumps(raw, separators=(",", ":")).encode(), 9)
    return base64.urlsafe_b64encode(packed).decode().rstrip("=")


def decode_token(text: str, digest: str) -> BrowseToken:
    try:
        raw = json.loads(zlib.decompress(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))))
        token = BrowseToken(str(raw["d"]), int(raw["e"]), {
            str(name): BrokerPlace({(str(t), int(q)): int(o) for t, q, o in p["c"]}, {(str(t), int(q)) for t, q in p["x"]}, bool(p["f"]))
            for name, p in raw["b"].items()
        })
    except (ValueError, TypeError, KeyError, AttributeError, zlib.error) as exc:
        raise BadBrowseTokenError("continuation_token: not a browse token issued by this router") from exc
    if token.digest != digest:
        raise BadBrowseTokenError("continuation_token: issued for another topic, window, tag expression, order or queue")
    return token


def order_key(msg: common_pb2.StoredMessage, oldest_first: bool) -> tuple[int, str, str, int, int]:
    """Store time, then broker, queue and queue offset: one total order for every page."""
    if oldest_first:
        return (msg.store_timestamp, msg.broker_name, msg.topic, msg.queue_id, msg.queue_offset)
    return (-msg.store_timestamp, msg.broker_name, msg.topic, msg.queue_id, -msg.queue_offset)


@dataclass
class BrowsePage:
    messages: list[common_pb2.StoredMessage]
    token: BrowseToken
    more: bool


def merge_page(answers: dict[str, commitlog_pb2.BrowseMessagesResponse], token: BrowseToken, max_num: int, oldest_first: bool) -> BrowsePage:
    """The next page from the brokers that answered, and the token after it.

    `token.brokers` holds every broker of the browse; those missing from `answers` did not
    answer and keep their place."""
    candidates: list[tuple[tuple[int, str, str, int, int], common_pb2.StoredMessage]] = []
    bound: tuple[int, str, str, int, int] | None = None
    for name, answer in answers.items():
        for msg in answer.messages:
            msg.broker_name = name
        keys = [order_key(m, oldest_first) for m in answer.messages]
        candidates.extend(zip(keys, answer.messages))
        if keys and not all(q.exhausted for q in answer.queues):
            last = keys[-1]
            bound = last if bound is None or last < bound else bound
    candidates.sort(key=lambda kv: kv[0])
    page: list[common_pb2.StoredMessage] = []
    size = 0
    for k, m in candidates:
        # A page stays well inside a gRPC message: it may end early; the token says where.
        if len(page) >= max_num or (bound is not None and k > bound) or (page and size + m.store_size > MAX_PAGE_BYTES):
            break
        page.append(m)
        size += m.store_size
    step = 1 if oldest_first else -1
    new = BrowseToken(token.digest, token.end, {n: BrokerPlace(dict(p.cursors), set(p.done), p.finished) for n, p in token.brokers.items()})
    consumed: dict[str, dict[QueueKey, int]] = {}
    for msg in page:
        consumed.setdefault(msg.broker_name, {})[(msg.topic, msg.queue_id)] = msg.queue_offset
    for name, answer in answers.items():
        place = new.brokers.setdefault(name, BrokerPlace())
        taken = consumed.get(name, {})
        for q, offset in taken.items():
            place.cursors[q] = offset + step
        returned: dict[QueueKey, int] = {}
        for msg in answer.messages:
            returned[(msg.topic, msg.queue_id)] = returned.get((msg.topic, msg.queue_id), 0) + 1
        taken_count: dict[QueueKey, int] = {}
        for msg in page:
            if msg.broker_name == name:
                taken_count[(msg.topic, msg.queue_id)] = taken_count.get((msg.topic, msg.queue_id), 0) + 1
        for state in answer.queues:
            key = (state.topic, state.queue_id)
            if state.exhausted and taken_count.get(key, 0) == returned.get(key, 0):
                place.done.add(key)
                place.cursors.pop(key, None)
        place.finished = all((q.topic, q.queue_id) in place.done for q in answer.queues)
    more = any(not p.finished for p in new.brokers.values())
    return BrowsePage(page, new, more)


def expired_ranges(answers: dict[str, commitlog_pb2.BrowseMessagesResponse]) -> list[common_pb2.ExpiredRange]:
    """What each answering broker says retention deleted of the window, named by broker."""
    out = []
    for name, answer in sorted(answers.items()):
        if answer.HasField("expired"):
            gone = common_pb2.ExpiredRange()
            gone.CopyFrom(answer.expired)
            gone.broker_name = name
            out.append(gone)
    return out


def expired_note(gone: common_pb2.ExpiredRange) -> str:
    """The range in words, as a page's note: broker, physical offsets, store times, queue offsets."""
    when = f"stored at or before {iso_ms(gone.stored_at_or_before)}" if gone.stored_at_or_before else "store times unknown"
    queues = ", ".join(f"{q.topic}/{q.queue_id} [{q.from_queue_offset}, {q.to_queue_offset})" for q in gone.queues[:NOTED_QUEUES])
    if len(gone.queues) > NOTED_QUEUES:
        queues += f", … ({len(gone.queues)} queues)"
    return (f"broker {gone.broker_name}: messages of this window may be gone: retention deleted the CommitLog segments holding "
            f"physical offsets [{gone.from_physical_offset}, {gone.to_physical_offset}) ({when}); queue offsets gone: {queues}")
