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

from quarry.formats.scheduled import PARKING_TOPICS
from quarry.v1 import common_pb2


def of_topic(msg: common_pb2.StoredMessage, topic: str) -> bool:
    """Stored under `topic`, or a delayed message parked for it (marked by the commitlog)."""
    return msg.topic == topic or (msg.topic in PARKING_TOPICS and msg.real_topic == topic)


def key_matches(msg: common_pb2.StoredMessage, topic: str, key: str) -> bool:
    """True when the message is of `topic` and one of its KEYS tokens is exactly `key`."""
    return of_topic(msg, topic) and key in msg.keys


def unique_key_matches(msg: common_pb2.StoredMessage, topic: str, unique_key: str) -> bool:
    return of_topic(msg, topic) and msg.unique_key == unique_key


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
    collisions: int
    next_token: PageToken | None


def merge_key_answers(
    answers: dict[str, list[common_pb2.StoredMessage]],
    topic: str,
    key: str,
    max_num: int,
    after: PageToken | None,
    digest: str,
    fetch_cap: int,
) -> KeyPage:
    """Filter collisions, order newest first, cap at max_num, and say where each broker stands.

    `answers` maps each broker that answered to what its index returned (at most fetch_cap).
    A broker whose matches were all taken and that returned fewer than fetch_cap entries is
    exhausted; otherwise its next page starts below the last offset this page consumed.
    """
    matched: dict[str, list[common_pb2.StoredMessage]] = {}
    collisions = 0
    for broker, msgs in answers.items():
        keep = []
        for msg in msgs:
            if key_matches(msg, topic, key):
                keep.append(msg)
            else:
                collisions += 1
        matched[broker] = keep
    ordered = sorted(dedupe(m for ms in matched.values() for m in ms), key=order_key)
    page = ordered[:max_num]
    taken = {(m.broker_name, m.commit_log_offset) for m in page}
    bounds = dict(after.bounds) if after else {}
    for broker, raw in answers.items():
        page_offsets = [m.commit_log_offset for m in page if m.broker_name == broker]
        cut = [m for m in matched[broker] if (broker, m.commit_log_offset) not in taken]
        if cut:
            if page_offsets:
                bounds[broker] = min(page_offsets)
        elif len(raw) >= fetch_cap:
            bounds[broker] = min(m.commit_log_offset for m in raw)
        else:
            bounds[broker] = -1
        if bounds.get(broker) == 0:
            bounds[broker] = -1  # nothing lies below offset 0
    more = any(v != -1 for v in bounds.values())
    token = PageToken(bounds, digest) if page and more else None
    return KeyPage(page, collisions, token)


def merge_unique_key_answers(
    answers: Iterable[common_pb2.StoredMessage], topic: str, unique_key: str
) -> tuple[list[common_pb2.StoredMessage], int]:
    """All copies of a unique key, earliest store time first, and the count of collisions dropped."""
    copies, collisions = [], 0
    for msg in answers:
        if unique_key_matches(msg, topic, unique_key):
            copies.append(msg)
        else:
            collisions += 1
    return sorted(dedupe(copies), key=lambda m: (m.store_timestamp, m.broker_name, m.commit_log_offset)), collisions
