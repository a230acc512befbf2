"""The stacked key filter and the lookup over it: one probe names the files that may hold a
key, and answers equal a walk of every file (windows, collisions, paging, many files, absent
keys, files dropped, appended while queried, reopened from disk)."""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from quarry.formats.index_file import IndexFile
from quarry.formats.java_hash import index_key_hash
from quarry.formats.index_keys import key_name
from quarry.services.indexer.index_follow import refresh
from quarry.services.indexer.index_store import IndexStore, IndexStoreConfig
from quarry.services.indexer.key_filter import _M32, _MULT, K, StackedKeyFilter, rows_of

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


def test_no_file_holding_a_hash_is_ever_missed_and_candidates_come_newest_first() -> None:
    rng = random.Random(1)
    flt: StackedKeyFilter[str] = StackedKeyFilter(500)
    held: dict[str, list[int]] = {}
    for i in range(40):  # past the first 8 columns: the matrix grows
        name = f"f{i:02d}"
        flt.add(name)
        held[name] = [rng.getrandbits(31) for _ in range(500)]
        flt.add_hashes(name, np.array(held[name]), 500)
    for name, hashes in held.items():
        for h in hashes[::25]:
            got = flt.candidates(h)
            assert name in got
            assert got == sorted(got, reverse=True)  # names sort as the files were added
    false = sum(len(flt.candidates(rng.getrandbits(31) | 1 << 31)) for _ in range(5000))
    assert false / 5000 / 40 < 0.005  # the design point is ~0.0006 per file


def test_a_removed_files_column_is_cleared_and_reused_in_order() -> None:
    flt: StackedKeyFilter[str] = StackedKeyFilter(100)
    for name in "abcdefgh":
        flt.add(name)
        flt.add_hashes(name, np.array([42]), 1)
    flt.remove("a")
    assert flt.candidates(42) == list("hgfedcb")
    flt.add("i")  # takes a's column, yet is the newest
    assert flt.candidates(42) == list("hgfedcb") and flt.covered("i") == 0
    flt.add_hashes("i", np.array([42]), 1)
    assert flt.candidates(42) == list("ihgfedcb")


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="capacity_per_file"):
        StackedKeyFilter(0)
    with pytest.raises(ValueError, match="filter rows"):
        StackedKeyFilter(2**31)


def _filled(tmp_path: Path, files: int, per_file: int = 9) -> IndexStore:
    """`files` full files of 9 entries; keys repeat across files, a few collide by hash."""
    s = IndexStore.open(tmp_path / "index", IndexStoreConfig(hash_slot_num=3, index_num=per_file + 1, max_msgs_num_batch=64))
    rng = random.Random(files)
    # "Aa" and "BB" have the same Java hash, so T#Aa and T#BB share every slot and chain.
    keys = ["Aa", "BB", "hot", "warm"] + [f"k{i}" for i in range(60)]
    for i in range(files * per_file):
        s.index_records([D(100 * (i + 1), rng.choice(keys), BASE + i * 700)])
    assert len(s.files) == files
    return s


@pytest.mark.parametrize("files", [1, 3, 40])
def test_lookup_equals_walking_every_file(tmp_path: Path, files: int) -> None:
    s = _filled(tmp_path, files)
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
    walked: list[str] = []
    real = IndexFile.select_phy_offsets

    def spy(self: IndexFile, *a: object, **kw: object) -> list[int]:
        walked.append(self.path.name)
        return real(self, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(IndexFile, "select_phy_offsets", spy)
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
    assert index.query("T", "z", 64, 0, 2**62) == []  # the header says 1 entry until read again
    refresh(index)
    assert index.query("T", "z", 64, 0, 2**62) == [200]
    writer.close()
    index.close()


def test_a_reopened_store_and_a_torn_file_answer_as_before(tmp_path: Path) -> None:
    s = _filled(tmp_path, 6)
    want = {k: s.query("T", k, 64, 0, 2**62) for k in ("Aa", "hot", "k3", "absent")}
    names = [f.path.name for f in s.files]
    s.close()
    again = IndexStore.open(tmp_path / "index", IndexStoreConfig(hash_slot_num=3, index_num=10, max_msgs_num_batch=64))
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
    third.index_records([D(10**6, "hot", BASE + 10**6)])  # re-indexing continues into a new file
    assert third.query("T", "hot", 1, 0, 2**62) == [10**6]
    third.close()


def test_dropped_files_are_no_longer_candidates(tmp_path: Path) -> None:
    s = IndexStore.open(tmp_path / "index", IndexStoreConfig(hash_slot_num=3, index_num=4, max_files=2))
    for i in range(12):
        s.index_records([D(100 * (i + 1), f"k{i}", BASE + i)])
    assert len(s.files) == 2
    assert s.query("T", "k0", 64, 0, 2**62) == [] and s.query("T", "k11", 64, 0, 2**62) == [1200]
    s.delete_below(s.files[-1].header.begin_phy_offset)
    assert len(s.files) == 1 and s.query("T", "k11", 64, 0, 2**62) == [1200]
    for f in list(s.files):
        assert s.key_filter.candidates(index_key_hash("T#k11")) == [f]
    s.close()
