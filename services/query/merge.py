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

from quarry.v1 import common_pb2


def key_matches(msg: common_pb2.StoredMessage, topic: str, key: str) -> bool:
    """True when the message is of `topic` and one of its KEYS tokens is exactly `key`."""
    return msg.topic == topic and key in msg.keys


def unique_key_matches(msg: common_pb2.StoredMessage, topic: str, unique_key: str) -> bool:
    return msg.topic == topic and msg.unique_key == unique_key


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
    """Position of the last message returned: the next page starts strictly after it."""

    store_timestamp: int
    broker_name: str
    offset: int
    query_digest: str

    def position(self) -> tuple[int, str, int]:
        return (-self.store_timestamp, self.broker_name, -self.offset)


class BadTokenError(ValueError):
    """A continuation token that does not decode or belongs to another query."""


def query_digest(topic: str, key: str, begin: int, end: int) -> str:
    return hashlib.sha256(f"{topic}\x00{key}\x00{begin}\x00{end}".encode()).hexdigest()[:16]


def encode_token(token: PageToken) -> str:
    raw = json.dumps([token.store_timestamp, token.broker_name, token.offset, token.query_digest], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_token(text: str, digest: str) -> PageToken:
    """Decode a token and check it was issued for the same query (topic, key, window)."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        ts, broker, offset, qd = json.loads(raw)
        token = PageToken(int(ts), str(broker), int(offset), str(qd))
    except (ValueError, TypeError) as exc:
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
    answers: Iterable[common_pb2.StoredMessage],
    topic: str,
    key: str,
    max_num: int,
    after: PageToken | None,
    digest: str,
    more_available: bool = False,
) -> KeyPage:
    """Filter collisions, order newest first, skip up to `after`, cap at max_num.

    A next-page token is issued when matches beyond max_num were seen, or when a broker
    filled its whole answer (`more_available`), since it may hold older matches.
    """
    matched: list[common_pb2.StoredMessage] = []
    collisions = 0
    for msg in answers:
        if key_matches(msg, topic, key):
            matched.append(msg)
        else:
            collisions += 1
    ordered = sorted(dedupe(matched), key=order_key)
    if after is not None:
        pos = after.position()
        ordered = [m for m in ordered if order_key(m) > pos]
    page = ordered[:max_num]
    token = None
    if page and (len(ordered) > max_num or more_available):
        last = page[-1]
        token = PageToken(last.store_timestamp, last.broker_name, last.commit_log_offset, digest)
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
