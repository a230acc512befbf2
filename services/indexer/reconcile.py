"""Whether the log still holds what the index was built from, and where they part if not.

A commitlog's recovery cuts a torn tail, an operator restores a snapshot or repairs a file by
hand: the log may then end below records the indexer had indexed, and new records are written
over their offsets. An index that kept its entries and its checkpoint would answer with records
that are no longer there (or are other records now) and wait for ever at a position the log no
longer reaches. So, each time the tail (re)connects, the newest entry is checked against the
record at its offset; if that record is gone or another one, the last entry whose record is
still the one indexed is searched for (entries are in log order: whether an entry's record
still holds is true up to the cut and false after it), and everything after it is dropped.

An entry keeps its key's hash, its offset and its time to the second, so a record "is still the
one indexed" when it starts at the entry's offset, one of its index names has the entry's hash
and its store time falls in the entry's second; the newest entry is checked against its exact
store time too (the index's header keeps it to the millisecond).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Awaitable, Callable, Protocol, Sequence

from quarry.formats.index_keys import index_names
from quarry.formats.java_hash_batch import index_key_hashes

SAMPLES = 64  # entries checked per lookup round: a search over 20 million entries takes 4 rounds


class Record(Protocol):
    """What is read of a record (a StoredMessage)."""

    topic: str
    keys: Sequence[str]
    unique_key: str
    store_timestamp: int
    store_size: int
    commit_log_offset: int


# Reads the records starting at the given offsets: offset -> record, None when none starts
# there, and offsets whose record is damaged (there, but unreadable) left out.
Lookup = Callable[[list[int]], Awaitable[dict[int, "Record | None"]]]


class Entries(Protocol):
    """The index, as the search reads it (IndexStore)."""

    last_update_phy_offset: int
    last_update_timestamp: int

    def entry_count(self) -> int: ...
    def entry_at(self, position: int) -> tuple[int, int, int]: ...


@dataclass
class Held:
    """The last entry whose record the log still holds: resume after its record."""

    phy_offset: int  # -1: none (resume from the log's minimum)
    store_timestamp: int
    end: int  # the record's end: where indexing resumes


def still_indexed(entry: tuple[int, int, int], record: "Record | None") -> bool:
    """Whether `record` is the one `entry` (keyHash, offset, entry time) was written for."""
    if record is None:
        return False
    key_hash, _phy, entry_ms = entry
    if not entry_ms <= record.store_timestamp < entry_ms + 1000:
        return False
    return key_hash in index_key_hashes(index_names(record.topic, " ".join(record.keys), record.unique_key))


async def newest_held(index: Entries, lookup: Lookup, min_offset: int) -> Held | None:
    """Where to resume if the newest entry's record is still the one indexed (or there is
    nothing to check: no entry, or it expired), None when it is gone or another record."""
    offset = index.last_update_phy_offset
    if offset < 0 or offset < min_offset:
        return Held(offset, index.last_update_timestamp, min_offset)
    record = (await lookup([offset])).get(offset, True)  # damaged: left out, taken as there
    if record is True:
        return Held(offset, index.last_update_timestamp, offset)
    if record is None or record.store_timestamp != index.last_update_timestamp:  # type: ignore[union-attr]
        return None
    return Held(offset, record.store_timestamp, record.commit_log_offset + record.store_size)  # type: ignore[union-attr]


async def last_held(index: Entries, lookup: Lookup, min_offset: int) -> Held:
    """Search the entries, newest rounds first, for the last one whose record is still there.

    Entries below the log's minimum (expired) are taken as held: nothing can be checked there
    and nothing after the cut lies below it. Call with the index not changing meanwhile."""
    count = index.entry_count()
    good, bad = -1, count  # positions: good holds (or is virtual), bad does not (or is virtual)
    good_entry: tuple[int, int, int] | None = None
    good_record: "Record | None" = None
    while bad - good > 1:
        step = max(1, (bad - good) // (SAMPLES + 1))
        positions = list(range(good + step, bad, step))[:SAMPLES]
        entries = [index.entry_at(p) for p in positions]
        checked = [e[1] for e in entries if e[1] >= min_offset]
        records = await lookup(sorted(set(checked))) if checked else {}
        for position, entry in zip(positions, entries):
            record = records.get(entry[1], True) if entry[1] >= min_offset else True
            if record is True or still_indexed(entry, record):  # type: ignore[arg-type]
                good, good_entry, good_record = position, entry, (None if record is True else record)  # type: ignore[assignment]
            else:
                bad = position
                break
    if good_entry is None:
        return Held(-1, 0, min_offset)
    if good_record is None:  # expired (resume at the minimum) or damaged (at it: a record start)
        return Held(good_entry[1], good_entry[2], max(min_offset, good_entry[1]))
    return Held(good_entry[1], good_record.store_timestamp, good_record.commit_log_offset + good_record.store_size)
