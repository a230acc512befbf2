"""The stacked key filter and the lookup over it: one probe names the files that may hold a
key, and answers equal a walk of every file (windows, collisions, paging, many files, absent
keys, files dropped, appended while queried, reopened from disk)."""
from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from quarry.formats.index_file import IndexFile, IndexFileError
from quarry.formats.java_hash import index_key_hash
from quarry.formats.index_keys import key_name
from quarry.services.indexer.index_follow import refresh
from quarry.services.indexer.index_store import IndexStore, IndexStoreConfig
from quarry.services.indexer.filter_builder import FilterBuilder, build_pending
from quarry.services.indexer.key_filter import _M32, _MULT, K, StackedKeyFilter, next_width, rows_of

BASE = 1_700_000_000_000


@dataclass
class D:
    physical_offset: int
    keys: str
    store_timestamp: int
    topic: str = "T"
    unique_key: str = ""
    sys_flag: int = 0


def _walk_all(store: IndexStore, key: str, max_num: int, begin: int, end: int, below: int | None = None) -> list[int]:
    """The answer without the filter: every file walked, newest first (the reference)."""
    begin, end = IndexFile.entry_time_window(begin, end)
    out: list[int] = []
    for f in reversed(store.files):
        if len(out) >= max_num:
            break
        if below is not None and f.header.begin_phy_offset >= below and f.entries:
            continue
        if f.is_time_matched(begin, end):
            f.select_phy_offsets(key_name("T", key), max_num, begin, end, into=out, below=below)
        if f.header.begin_timestamp < begin:
            break
    return list(dict.fromkeys(out))


def test_rows_computed_in_numpy_equal_the_probes_python_arithmetic() -> None:
    rng = random.Random(7)
    hashes = [0, 1, 2**31 - 1, 2**31] + [rng.getrandbits(31) for _ in range(2000)]
    for rows in (64, 48_024, 480_000_000):
        got = rows_of(np.array(hashes), rows)
        assert len(got) == K
        for i, h in enumerate(hashes):
            p = h * _MULT
            assert [int(r[i]) for r in got] == [((p >> (64 * (j + 1)) & _M32) * rows >> 32) for j in range(K)]
            assert all(0 <= int(r[i]) < rows for r in got)


def _filter_of(names_hashes: list[tuple[str, list[int]]], capacity: int) -> StackedKeyFilter[str]:
    flt: StackedKeyFilter[str] = StackedKeyFilter(capacity)
    for seq, (name, hashes) in enumerate(names_hashes):
        col = flt.reserve()
        flt.build(col, [np.array(hashes[: len(hashes) // 2]), np.array(hashes[len(hashes) // 2:])])
        flt.publish(col, name, seq)
    return flt


def test_no_file_holding_a_hash_is_ever_missed_and_candidates_come_newest_first() -> None:
    rng = random.Random(1)
    held = [(f"f{i:02d}", [rng.getrandbits(31) for _ in range(500)]) for i in range(80)]
    # 80 columns: the rows widen 1, 2, 4 bits, then bytes (sub-byte and byte layouts, and
    # columns built before each widening, all probed after it).
    flt = _filter_of(held, 500)
    assert flt.width == next_width(0, 80) >= 80
    for name, hashes in held:
        for h in hashes[::25]:
            got = flt.candidates(h)
            assert name in got
            assert got == sorted(got, reverse=True)  # names sort as the files were added
    false = sum(len(flt.candidates(rng.getrandbits(31) | 1 << 31)) for _ in range(5000))
    assert false / 5000 / 80 < 0.005  # the design point is ~0.0006 per file


@pytest.mark.parametrize("files", [1, 2, 3, 5, 9])
def test_sub_byte_rows_keep_every_column(files: int) -> None:
    rng = random.Random(files)
    held = [(f"f{i}", [rng.getrandbits(31) for _ in range(300)]) for i in range(files)]
    flt = _filter_of(held, 300)
    for name, hashes in held:
        assert all(name in flt.candidates(h) for h in hashes)


def test_a_removed_files_column_is_cleared_and_reused_in_order() -> None:
    for n in (3, 8, 20):  # sub-byte rows, one byte, several bytes
        names = [f"n{i:02d}" for i in range(n)]
        flt = _filter_of([(name, [42]) for name in names], 100)
        flt.release(0)  # n00's column: reserved again next, its bit cleared before reuse
        assert flt.candidates(42) == names[1:][::-1]
        col = flt.reserve()
        assert col == 0
        flt.build(col, [np.array([7])])
        assert flt.candidates(42) == names[1:][::-1]  # not published yet: not named
        flt.publish(col, "new", n)
        assert flt.candidates(42) == names[1:][::-1] and flt.candidates(7) == ["new"]


def test_memory_follows_the_sealed_files_not_their_capacity() -> None:
    capacity = 20_000
    ideal = capacity * 24 // 8  # bytes of one file's column
    flt: StackedKeyFilter[int] = StackedKeyFilter(capacity)
    assert flt.memory_bytes() == 0  # nothing sealed: nothing held
    for n in range(1, 140):
        col = flt.reserve()
        flt.build(col, [np.arange(10)])
        flt.publish(col, n, n)
        assert flt.memory_bytes() >= n * ideal
        assert flt.memory_bytes() <= (2 if n <= 64 else 1.125) * max(n, 8 if n > 4 else n) * ideal + 8 * 8, n


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="capacity_per_file"):
        StackedKeyFilter(0)
    with pytest.raises(ValueError, match="filter rows"):
        StackedKeyFilter(2**31)


def _filled(tmp_path: Path, files: int, per_file: int = 9, built: bool = True) -> IndexStore:
    """`files` full files of 9 entries; keys repeat across files, a few collide by hash.
    built=False: no filter is built (every file walked, as just after open)."""
    s = IndexStore.open(tmp_path / "index", IndexStoreConfig(hash_slot_num=3, index_num=per_file + 1, max_msgs_num_batch=64))
    rng = random.Random(files)
    # "Aa" and "BB" have the same Java hash, so T#Aa and T#BB share every slot and chain.
    keys = ["Aa", "BB", "hot", "warm"] + [f"k{i}" for i in range(60)]
    for i in range(files * per_file):
        s.index_records([D(100 * (i + 1), rng.choice(keys), BASE + i * 700)])
    assert len(s.files) == files
    assert len(s.unfiltered) == files
    if built:
        assert build_pending(s) == files  # all full, so all sealed
        assert s.unfiltered == [] and s.key_filter.published == files
    return s


@pytest.mark.parametrize("built", [True, False])
@pytest.mark.parametrize("files", [1, 3, 40])
def test_lookup_equals_walking_every_file(tmp_path: Path, files: int, built: bool) -> None:
    s = _filled(tmp_path, files, built=built)
    last = BASE + files * 9 * 700
    windows = [(0, 2**62), (BASE, last), (BASE + 5_000, BASE + 9_000), (last + 10_000, last + 20_000), (0, BASE - 1), (BASE + 3_456, BASE + 3_457)]
    for key in ["Aa", "BB", "hot", "warm", "k7", "k59", "absent", "Ab"]:
        for begin, end in windows:
            for max_num in (1, 5, 64):
                want = _walk_all(s, key, max_num, begin, end)
                assert s.query("T", key, max_num, begin, end) == want, (key, begin, end, max_num)
                page, below = s.query_page("T", key, max_num, begin, end)
                assert page == want
                flat = list(page)
                while below:  # page after page, each as walking every file below the last one
                    prev_below = below
                    page, below = s.query_page("T", key, max_num, begin, end, prev_below)
                    assert page == _walk_all(s, key, max_num, begin, end, prev_below)
                    flat += page
                assert flat == _walk_all(s, key, 10**6, begin, end), (key, begin, end, max_num)
    # The collision partner's offsets come back too (the hash is all an IndexFile keeps).
    assert set(s.query("T", "Aa", 64, 0, 2**62)) == set(s.query("T", "BB", 64, 0, 2**62))
    s.close()


def test_files_outside_the_window_are_not_walked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = _filled(tmp_path, 20)
    walked = _count_walks(monkeypatch)
    newest = s.files[-1]
    s.query("T", "hot", 64, newest.header.begin_timestamp, newest.header.end_timestamp)
    assert walked and set(walked) <= {f.path.name for f in s.files[-2:]}
    walked.clear()
    assert s.query("T", "absent-key", 64, 0, 2**62) == [] and len(walked) <= 1  # at most a false candidate
    s.close()


def test_a_file_appended_while_being_queried_answers_its_new_entries(tmp_path: Path) -> None:
    s = IndexStore.open(tmp_path / "index", IndexStoreConfig(hash_slot_num=3, index_num=10))
    s.index_records([D(100, "a", BASE)])
    assert s.query("T", "a", 64, 0, 2**62) == [100] and s.query("T", "b", 64, 0, 2**62) == []
    s.index_records([D(200, "b", BASE + 1000), D(300, "a", BASE + 2000)])  # the same (newest) file
    assert s.query("T", "b", 64, 0, 2**62) == [200] and s.query("T", "a", 64, 0, 2**62) == [300, 100]
    s.index_record(D(400, "c", BASE + 3000))  # the one-record path too
    assert s.query("T", "c", 64, 0, 2**62) == [400]
    s.close()


def test_a_followed_file_shows_the_writers_new_entries_after_refresh(tmp_path: Path) -> None:
    d = tmp_path / "index"
    d.mkdir()
    writer = IndexFile(d / "20261123100000000", 3, 10)
    writer.put_key("T#a", 100, BASE)
    index = IndexStore.open(d, IndexStoreConfig(hash_slot_num=3, index_num=10, read_only=True))
    assert index.query("T", "a", 64, 0, 2**62) == [100]
    writer.put_key("T#z", 200, BASE + 1000)
    refresh(index)
    assert index.query("T", "z", 64, 0, 2**62) == [200]
    # The writer moves on to a new file: the old one is sealed, gets its filter, and a key
    # in either is still found.
    newer = IndexFile(d / "20261123100000001", 3, 10, 200, BASE + 1000)
    newer.put_key("T#y", 300, BASE + 2000)
    refresh(index)
    assert build_pending(index) == 1 and index.unfiltered == [index.files[-1]]
    assert [index.query("T", k, 64, 0, 2**62) for k in "azy"] == [[100], [200], [300]]
    # A sealed file whose header moves again (not RocketMQ's way, but possible on disk) is
    # walked again until rebuilt: nothing it holds is hidden.
    writer.put_key("T#x", 250, BASE + 1500)
    refresh(index)
    assert index.query("T", "x", 64, 0, 2**62) == [250] and len(index.unfiltered) == 2
    assert build_pending(index) == 1 and index.query("T", "x", 64, 0, 2**62) == [250]
    newer.close()
    writer.close()
    index.close()


def test_a_reopened_store_and_a_torn_file_answer_as_before(tmp_path: Path) -> None:
    s = _filled(tmp_path, 6)
    want = {k: s.query("T", k, 64, 0, 2**62) for k in ("Aa", "hot", "k3", "absent")}
    assert want == {k: _walk_all(s, k, 64, 0, 2**62) for k in want}
    names = [f.path.name for f in s.files]
    s.close()
    again = IndexStore.open(tmp_path / "index", IndexStoreConfig(hash_slot_num=3, index_num=10, max_msgs_num_batch=64))
    assert len(again.unfiltered) == 6 and again.key_filter.memory_bytes() == 0  # nothing built on open
    assert {k: again.query("T", k, 64, 0, 2**62) for k in want} == want
    assert build_pending(again) == 6
    assert {k: again.query("T", k, 64, 0, 2**62) for k in want} == want
    again.close()
    torn = tmp_path / "index" / names[3]
    raw = bytearray(torn.read_bytes())
    raw[36:40] = (999).to_bytes(4, "big")  # indexCount beyond the file: set aside, newer ones too
    torn.write_bytes(bytes(raw))
    third = IndexStore.open(tmp_path / "index", IndexStoreConfig(hash_slot_num=3, index_num=10, max_msgs_num_batch=64))
    assert len(third.files) == 3 and third.rebuild_from is not None
    for k in want:
        assert third.query("T", k, 64, 0, 2**62) == _walk_all(third, k, 64, 0, 2**62)
    build_pending(third)
    third.index_records([D(10**6, "hot", BASE + 10**6)])  # re-indexing continues into a new file
    assert third.query("T", "hot", 1, 0, 2**62) == [10**6]
    for k in want:
        assert third.query("T", k, 64, 0, 2**62) == _walk_all(third, k, 64, 0, 2**62)
    third.close()


def test_dropped_files_are_no_longer_candidates(tmp_path: Path) -> None:
    s = IndexStore.open(tmp_path / "index", IndexStoreConfig(hash_slot_num=3, index_num=4, max_files=2))
    for i in range(12):
        s.index_records([D(100 * (i + 1), f"k{i}", BASE + i)])
        build_pending(s)
    assert len(s.files) == 2
    assert s.query("T", "k0", 64, 0, 2**62) == [] and s.query("T", "k11", 64, 0, 2**62) == [1200]
    s.delete_below(s.files[-1].header.begin_phy_offset)
    assert len(s.files) == 1 and s.query("T", "k11", 64, 0, 2**62) == [1200]
    for f in list(s.files):
        assert s.key_filter.candidates(index_key_hash("T#k11")) == [f]
    s.close()


def _count_walks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    walked: list[str] = []
    real = IndexFile.select_phy_offsets

    def spy(self: IndexFile, *a: object, **kw: object) -> list[int]:
        walked.append(self.path.name)
        return real(self, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(IndexFile, "select_phy_offsets", spy)
    return walked


def test_a_store_opened_serves_at_once_and_the_background_build_then_takes_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _filled(tmp_path, 30, built=False).close()
    s = IndexStore.open(tmp_path / "index", IndexStoreConfig(hash_slot_num=3, index_num=10, max_msgs_num_batch=64))
    keys = ["Aa", "BB", "hot", "k7", "k59", "absent"]
    want = {k: _walk_all(s, k, 64, 0, 2**62) for k in keys}
    assert len(s.filter_pending()) == 30 and s.key_filter.published == 0
    walked = _count_walks(monkeypatch)
    assert s.query("T", "absent", 64, 0, 2**62) == [] and len(walked) == 30  # no filter yet: the walk
    lock = threading.Lock()
    builder = FilterBuilder(s, lock).start()
    try:
        deadline = time.monotonic() + 60
        pause = threading.Event()
        while True:  # answers stay exact at every point of the build
            with lock:
                assert {k: s.query("T", k, 64, 0, 2**62) for k in keys} == want
                pending = len(s.filter_pending())
            if not pending:
                break
            assert time.monotonic() < deadline, f"{pending} filters still pending"
            pause.wait(0.001)
        with lock:
            assert s.key_filter.published == 30 and s.unfiltered == []
            walked.clear()
            assert s.query("T", "absent", 64, 0, 2**62) == [] and len(walked) <= 1  # the probe now
            assert {k: s.query("T", k, 64, 0, 2**62) for k in keys} == want
            # A record indexed now goes to a new (unsealed) file, walked until it is sealed.
            s.index_records([D(10**6, "fresh", BASE + 10**6)])
            assert s.query("T", "fresh", 64, 0, 2**62) == [10**6] and s.unfiltered == [s.files[-1]]
    finally:
        builder.stop()
    s.close()


def test_a_file_whose_entries_cannot_be_read_stays_walked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = _filled(tmp_path, 4, built=False)
    broken = s.files[1]
    real = IndexFile.key_hash_chunks

    def cut(self: IndexFile, first: int, stop: int, chunk: int = 1 << 16):  # type: ignore[no-untyped-def]
        if self is broken:
            raise IndexFileError(f"{self.path}: cut short")
        return real(self, first, stop, chunk)

    monkeypatch.setattr(IndexFile, "key_hash_chunks", cut)
    assert build_pending(s) == 3
    assert s.unfiltered == [broken] and s.filter_pending() == []  # not retried in a loop
    for k in ("Aa", "hot", "k3", "absent"):
        assert s.query("T", k, 64, 0, 2**62) == _walk_all(s, k, 64, 0, 2**62)
    s.close()


def test_a_file_dropped_while_its_filter_is_built_is_not_published(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = _filled(tmp_path, 3, built=False)
    victim = s.files[-1]  # built first (newest first)
    real = IndexFile.key_hash_chunks

    def drop_meanwhile(self: IndexFile, first: int, stop: int, chunk: int = 1 << 16):  # type: ignore[no-untyped-def]
        if self is victim and victim in s.files:
            s.detach(victim)  # as the disk cap or expiry would, between reserve and publish
        return real(self, first, stop, chunk)

    monkeypatch.setattr(IndexFile, "key_hash_chunks", drop_meanwhile)
    assert build_pending(s) == 2
    assert victim not in s.key_filter.candidates(index_key_hash("T#hot")) and s.key_filter.published == 2
    victim.close()
    s.close()
