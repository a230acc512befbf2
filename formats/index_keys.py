"""Which names a record is indexed under, which records are not indexed, and IndexFile names.

RocketMQ's IndexService: a message is indexed under `topic#UNIQ_KEY` and `topic#k` for every
non-empty space-separated KEYS token; rollback records are not indexed (prepared and
committed ones are). IndexFiles are named by their creation time, yyyyMMddHHmmssSSS (UTC).
The streaming indexer, the pipeline's reindex and its lookup all use these rules.
"""
from __future__ import annotations

import re
import time
from typing import Iterable, Sequence

from quarry.formats.java_hash import index_key_hashes_of
from quarry.formats.properties import key_tokens
from quarry.formats.record import SYSFLAG_TRANSACTION_MASK, SYSFLAG_TRANSACTION_ROLLBACK
from quarry.formats.scheduled import PARKING_TOPICS

INDEX_FILE_NAME = re.compile(r"^\d{17}$")
# The transaction type (sys_flag & SYSFLAG_TRANSACTION_MASK) of records that are not indexed.
NOT_INDEXED_TRANSACTION = SYSFLAG_TRANSACTION_ROLLBACK


def is_indexed(sys_flag: int) -> bool:
    """False for a rollback record: its keys never enter the index."""
    return sys_flag & SYSFLAG_TRANSACTION_MASK != NOT_INDEXED_TRANSACTION


def key_name(topic: str, key: str) -> str:
    """The index name of one key (or unique key) of a topic."""
    return f"{topic}#{key}"


def key_hashes_under(topics: Sequence[str], key: str) -> list[int]:
    """The IndexFile key hash of `key` under each of `topics` (key_name's), the key hashed once."""
    return index_key_hashes_of([f"{t}#" for t in topics], key)


def index_names(topic: str, keys: str | None, unique_key: str | None) -> list[str]:
    """`topic#UNIQ_KEY`, then `topic#k` for each non-empty token of the space-separated KEYS."""
    names = [f"{topic}#{unique_key}"] if unique_key else []
    if keys:
        names.extend(f"{topic}#{k}" for k in key_tokens(keys))
    return names


def of_topic(record_topic: str, real_topic: str | None, topic: str) -> bool:
    """A record stored under `topic`, or a delayed message parked for it (its REAL_TOPIC)."""
    return record_topic == topic or (record_topic in PARKING_TOPICS and real_topic == topic)


def answers_key(record_topic: str, real_topic: str | None, keys: Iterable[str], unique_key: str | None, topic: str, key: str, unique: bool) -> bool:
    """Whether a record answers a key query for `key` under `topic`: the index answers by hash,
    so a record of another topic or key with the same hash must never be handed out. `keys`
    are the record's KEYS tokens; `unique` asks for its UNIQ_KEY instead."""
    if not of_topic(record_topic, real_topic, topic):
        return False
    return unique_key == key if unique else key in keys


def index_file_name(ms: int) -> str:
    """The name of an IndexFile created at epoch milliseconds `ms`."""
    return time.strftime("%Y%m%d%H%M%S", time.gmtime(ms / 1000)) + f"{ms % 1000:03d}"
