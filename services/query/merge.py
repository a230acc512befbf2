"""Merging brokers' answers: collision filtering, ordering, de-duplication, pages.

The index answers by hash, so it returns other keys and other topics that share the
hash or the slot; only exact matches survive here. Works on StoredMessage values.
"""
from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from typing import Iterable

from quarry.formats import index_keys
from quarry.v1 import common_pb2


def of_topic(msg: common_pb2.StoredMessage, topic: str) -> bool:
    """Stored under `topic`, or a delayed message parked for it (marked by the commitlog)."""
    return index_keys.of_topic(msg.topic, msg.real_topic, topic)


def in_window(msg: common_pb2.StoredMessage, begin: int, end: int) -> bool:
    """The message's own store time lies in [begin, end] (epoch ms, inclusive). IndexFile
    entries hold whole seconds, so the index alone cannot decide this."""
    return begin <= msg.store_timestamp <= end


def key_matches(msg: common_pb2.StoredMessage, topic: str, key: str, begin: int = 0, end: int = 2**63 - 1) -> bool:
    """True when the message is of `topic`, one of its KEYS tokens is exactly `key`, and it
    was stored in [begin, end]."""
    return index_keys.answers_key(msg.topic, msg.real_topic, msg.keys, msg.unique_key, topic, key, False) and in_window(msg, begin, end)


def unique_key_matches(msg: common_pb2.StoredMessage, topic: str, unique_key: str, begin: int = 0, end: int = 2**63 - 1) -> bool:
    return index_keys.answers_key(msg.topic, msg.real_topic, msg.keys, msg.unique_key, topic, unique_key, True) and in_window(msg, begin, end)


def order_key(msg: common_pb2.StoredMessage) -> tuple[int, str, int]:
    """Newest store time first; ties by broker name, then physical offset, newest first."""
    return (-msg.store_timestamp, msg.broker_name, -msg.commit_log_offset)


def dedupe(messages: Iterable[common_pb2.StoredMessage]) -> list[common_pb2.StoredMessage]:
    """Drop repeats of the same record (same broker, same physical offset)."""
    seen: set[tuple[str, int]] = set()
    out = []
    for msg in messages:
        ident = (msg.broker_name, msg.commit_log_offset)
        if ident not in seen:
            seen.add(ident)
            out.append(msg)
    return out


@dataclass(frozen=True)
class PageToken:
    """Where each broker's walk stands: the next page asks broker b only for offsets below
    bounds[b]; -1 means that broker has no more matches."""

    bounds: dict[str, int]
    query_digest: str


class BadTokenError(ValueError):
    """A continuation token that does not decode or belongs to another query."""


def query_digest(topic: str, key: str, begin: int, end: int) -> str:
    return hashlib.sha256(f"{topic}\x00{key}\x00{begin}\x00{end}".encode()).hexdigest()[:16]


def encode_token(token: PageToken) -> str:
    raw = json.dumps([token.bounds, token.query_digest], separators=(",", ":"), sort_keys=True)
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_token(text: str, digest: str) -> PageToken:
    """Decode a token and check it was issued for the same query (topic, key, window)."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        bounds, qd = json.loads(raw)
        token = PageToken({str(b): int(v) for b, v in bounds.items()}, str(qd))
    except (ValueError, TypeError, AttributeError) as exc:
        raise BadTokenError("continuation_token: not a token issued by this router") from exc
    if token.query_digest != digest:
        raise BadTokenError("continuation_token: issued for another topic, key or time window")
    return token


@dataclass
class KeyPage:
    messages: list[common_pb2.StoredMessage]
    next_token: PageToken | None


def merge_key_answers(
    matched: dict[str, list[common_pb2.StoredMessage]],
    more_below: dict[str, int],
    max_num: int,
    after: PageToken | None,
    digest: str,
) -> KeyPage:
    """Order every broker's matches newest first, cap at max_num, and say where each broker stands.

    `matched` maps each broker that answered to its matches (collisions already dropped);
    `more_below[b]` is the offset below which b's index may hold more entries (0: none).
    A broker whose matches were all taken continues below where its index read stopped;
    one with matches left over continues below the last one this page took.
    """
    ordered = sorted(dedupe(m for ms in matched.values() for m in ms), key=order_key)
    page = ordered[:max_num]
    taken = {(m.broker_name, m.commit_log_offset) for m in page}
    bounds = dict(after.bounds) if after else {}
    for broker, msgs in matched.items():
        page_offsets = [m.commit_log_offset for m in page if m.broker_name == broker]
        cut = [m for m in msgs if (broker, m.commit_log_offset) not in taken]
        if cut:
            if page_offsets:
                bounds[broker] = min(page_offsets)
        elif more_below.get(broker, 0) > 0:
            bounds[broker] = more_below[broker]
        else:
            bounds[broker] = -1
        if bounds.get(broker) == 0:
            bounds[broker] = -1  # nothing lies below offset 0
    more = any(v != -1 for v in bounds.values())
    token = PageToken(bounds, digest) if page and more else None
    return KeyPage(page, token)


def order_copies(copies: Iterable[common_pb2.StoredMessage]) -> list[common_pb2.StoredMessage]:
    """All copies of a unique key (already matched), earliest store time first, repeats dropped."""
    return sorted(dedupe(copies), key=lambda m: (m.store_timestamp, m.broker_name, m.commit_log_offset))
