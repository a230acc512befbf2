"""An index ahead of its log (issue 32, 1), in process: an IndexFile cut after an entry reads
byte for byte as one that never had the later puts; the index list drops what lies after a cut;
the search finds the last entry whose record the log still holds, whatever was written after."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from quarry.formats.index_file import IndexFile
from quarry.services.indexer.index_store import IndexStore, IndexStoreConfig
from quarry.services.indexer.reconcile import Held, last_held, newest_held
from tests.unit.test_key_filter import D

T0 = 1_700_000_000_000
SIZE = 100  # every record's size in these logs


def _puts(n: int, salt: str = "") -> list[tuple[str, int, int]]:
    # Few slots and repeated keys: chains run through many entries, across the cut.
    return [(f"T#k{i % 5}{salt}", i * SIZE, T0 + i * 700) for i in range(n)]


@pytest.mark.parametrize("keep", [0, 1, 7, 19, 20])
def test_an_index_file_cut_after_an_entry_is_the_file_without_the_later_puts(tmp_path: Path, keep: int) -> None:
    puts = _puts(20)
    cut = IndexFile(tmp_path / "cut", 3, 30)
    cut.put_keys(puts)  # type: ignore[arg-type]
    end_ts = puts[keep - 1][2] if keep else 0
    assert cut.truncate_entries(keep, end_ts) == 20 - keep
    cut.flush()
    fresh = IndexFile(tmp_path / "fresh", 3, 30)
    fresh.put_keys(puts[:keep])  # type: ignore[arg-type]
    fresh.flush()
    if keep == 0:  # an emptied file keeps the beginning it had (its next put's time counts from it)
        assert cut.header.index_count == 1 and cut.header.hash_slot_count == 0
        assert (tmp_path / "cut").read_bytes()[40:] == (tmp_path / "fresh").read_bytes()[40:]
        return
    assert (tmp_path / "cut").read_bytes() == (tmp_path / "fresh").read_bytes()
    # And it goes on as that file would.
    more = _puts(5, salt="x")
    cut.put_keys([(k, o + 10_000, t + 60_000) for k, o, t in more])  # type: ignore[misc]
    fresh.put_keys([(k, o + 10_000, t + 60_000) for k, o, t in more])  # type: ignore[misc]
    cut.flush(), fresh.flush()
    assert (tmp_path / "cut").read_bytes() == (tmp_path / "fresh").read_bytes()


def test_last_entry_at_or_below_is_a_search_over_offsets(tmp_path: Path) -> None:
    f = IndexFile(tmp_path / "f", 3, 30)
    f.put_keys(_puts(20))  # type: ignore[arg-type]
    assert f.last_entry_at_or_below(-1) == 0
    assert f.last_entry_at_or_below(0) == 1
    assert f.last_entry_at_or_below(550) == 6
    assert f.last_entry_at_or_below(10**9) == 20


@dataclass
class Rec:
    topic: str
    keys: list[str]
    store_timestamp: int
    commit_log_offset: int
    unique_key: str = ""
    store_size: int = SIZE


@dataclass
class Log:
    """Records by offset; `cut` rewrites the log from an offset with other records."""

    records: dict[int, Rec] = field(default_factory=dict)
    lookups: int = 0

    async def lookup(self, offsets: list[int]) -> dict[int, Rec | None]:
        self.lookups += 1
        return {o: self.records.get(o) for o in offsets}


def _indexed(tmp_path: Path, n: int, gap_ms: int = 300) -> tuple[IndexStore, Log]:
    index = IndexStore.open(tmp_path / "index", IndexStoreConfig(hash_slot_num=7, index_num=12))
    log = Log()
    for i in range(n):
        log.records[i * SIZE] = Rec("T", [f"k{i}", "all"], T0 + i * gap_ms, i * SIZE)
        index.index_records([D(i * SIZE, f"k{i} all", T0 + i * gap_ms)])
    return index, log


def test_an_index_the_log_still_holds_is_left_alone(tmp_path: Path) -> None:
    index, log = _indexed(tmp_path, 40)
    held = asyncio.run(newest_held(index, log.lookup, 0))
    assert held == Held(39 * SIZE, T0 + 39 * 300, 40 * SIZE)


@pytest.mark.parametrize("gap_ms", [300, 1500], ids=["busy", "a record every 1.5 s"])
@pytest.mark.parametrize("cut_at", [0, 1, 13, 38, 39])
def test_the_search_finds_where_the_log_parts_from_the_index(tmp_path: Path, cut_at: int, gap_ms: int) -> None:
    # With records over a second apart, a file's first entry counts its time from the previous
    # file's end: only the header holds it exactly, and a search misreading it drops whole files.
    index, log = _indexed(tmp_path, 40, gap_ms)
    # The log cut before record `cut_at`, then other records written over the same offsets (the
    # same sizes, so every old offset is a record start again), stored later.
    for i in range(cut_at, 45):
        log.records[i * SIZE] = Rec("T", [f"n{i}", "all"], T0 + 3_600_000 + i, i * SIZE)
    assert asyncio.run(newest_held(index, log.lookup, 0)) is None
    held = asyncio.run(last_held(index, log.lookup, 0))
    expected = Held((cut_at - 1) * SIZE, T0 + (cut_at - 1) * gap_ms, cut_at * SIZE) if cut_at else Held(-1, 0, 0)
    assert held == expected
    dropped = index.drop_after(held.phy_offset, held.store_timestamp)
    assert dropped == 2 * (40 - cut_at)
    assert index.entry_count() == 2 * cut_at
    assert index.query("T", "all", 64, 0, 2**62) == [i * SIZE for i in range(cut_at - 1, -1, -1)]
    assert index.last_update_phy_offset == (held.phy_offset if cut_at else -1)


def test_the_search_takes_few_lookups(tmp_path: Path) -> None:
    index, log = _indexed(tmp_path, 400)  # 800 entries over 73 files
    for i in range(321, 400):
        del log.records[i * SIZE]  # cut, nothing written after it
    held = asyncio.run(last_held(index, log.lookup, 0))
    assert held.end == 321 * SIZE and log.lookups <= 3


def test_expired_entries_are_taken_as_held(tmp_path: Path) -> None:
    index, log = _indexed(tmp_path, 40)
    for i in range(0, 10):
        del log.records[i * SIZE]  # expired: below the log's minimum
    for i in range(25, 40):
        del log.records[i * SIZE]
    held = asyncio.run(last_held(index, log.lookup, 10 * SIZE))
    assert held.end == 25 * SIZE
    for i in range(10, 25):
        del log.records[i * SIZE]  # everything indexed is gone, down to the minimum
    assert asyncio.run(last_held(index, log.lookup, 25 * SIZE)) == Held(24 * SIZE, index.entry_at(47)[2], 25 * SIZE)
