"""The IndexFile list: roll-over, newest-first across files, time pruning, what is not indexed,
read-only open, corrupt files set aside, the checkpoint."""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from pathlib import Path

import pytest

from quarry.formats.record import SYSFLAG_TRANSACTION_ROLLBACK
from quarry.services.indexer.checkpoint import IndexCheckpoint
from quarry.services.indexer.index_store import IndexStore, IndexStoreConfig


@dataclass
class D:
    physical_offset: int
    topic: str = "T"
    keys: str = ""
    unique_key: str = ""
    store_timestamp: int = 1_700_000_000_000
    sys_flag: int = 0


def _store(tmp_path: Path, **kw: object) -> IndexStore:
    return IndexStore.open(tmp_path / "index", IndexStoreConfig(hash_slot_num=7, index_num=10, **kw))  # type: ignore[arg-type]


def test_full_file_rolls_over_and_the_next_continues_where_it_ended(tmp_path: Path) -> None:
    s = _store(tmp_path)
    for i in range(30):
        s.index_record(D(i * 100, keys=f"k{i % 3}", store_timestamp=1_700_000_000_000 + i * 1000))
    infos = s.file_infos()
    assert len(infos) >= 4 and all(f.entries <= 9 for f in infos)
    for prev, nxt in zip(infos, infos[1:]):
        assert nxt.begin_phy_offset >= prev.end_phy_offset and nxt.begin_timestamp >= prev.end_timestamp
    assert s.query("T", "k1", 64, 0, 2**62) == [i * 100 for i in range(29, -1, -1) if i % 3 == 1]
    s.close()


def test_time_range_prunes_files_and_entries(tmp_path: Path) -> None:
    s = _store(tmp_path)
    base = 1_700_000_000_000
    for i in range(20):
        s.index_record(D(i, keys="k", store_timestamp=base + i * 10_000))
    got = s.query("T", "k", 64, base + 50_000, base + 120_000)
    assert got == [12, 11, 10, 9, 8, 7, 6, 5]
    s.close()


def test_every_keys_token_and_the_unique_key_are_indexed_rollback_is_not(tmp_path: Path) -> None:
    s = _store(tmp_path, max_msgs_num_batch=64)
    s.index_record(D(10, keys="a  b c", unique_key="U1"))
    s.index_record(D(20, keys="a", sys_flag=SYSFLAG_TRANSACTION_ROLLBACK))
    for key in ("a", "b", "c", "U1"):
        assert s.query("T", key, 64, 0, 2**62) == [10], key
    assert s.query("T", "", 64, 0, 2**62) == []
    s.close()


def test_redelivered_records_are_not_indexed_twice(tmp_path: Path) -> None:
    s = _store(tmp_path)
    for off in (10, 20, 30):
        s.index_record(D(off, keys="k"))
    for off in (10, 20, 30):
        s.index_record(D(off, keys="k"))
    assert s.query("T", "k", 64, 0, 2**62) == [30, 20, 10]
    s.close()


def test_max_num_is_capped(tmp_path: Path) -> None:
    s = IndexStore.open(tmp_path / "index", IndexStoreConfig(hash_slot_num=7, index_num=400, max_msgs_num_batch=5))
    for off in range(50):
        s.index_record(D(off, keys="k"))
    assert len(s.query("T", "k", 64, 0, 2**62)) == 5
    s.close()


def test_read_only_open_changes_no_byte(tmp_path: Path) -> None:
    s = _store(tmp_path)
    for off in range(25):
        s.index_record(D(off, keys="k"))
    s.close()
    files = sorted((tmp_path / "index").iterdir())
    before = [hashlib.sha256(p.read_bytes()).hexdigest() for p in files]
    ro = IndexStore.open(tmp_path / "index", IndexStoreConfig(hash_slot_num=7, index_num=10, read_only=True))
    assert ro.query("T", "k", 64, 0, 2**62)[:2] == [24, 23]
    ro.close()
    assert [hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((tmp_path / "index").iterdir())] == before


def test_corrupt_header_is_detected_reported_and_set_aside(tmp_path: Path) -> None:
    s = _store(tmp_path)
    for off in range(5):
        s.index_record(D(off, keys="k"))
    s.close()
    (path,) = list((tmp_path / "index").iterdir())
    data = bytearray(path.read_bytes())
    struct.pack_into(">i", data, 36, 99_999)  # indexCount far beyond capacity
    path.write_bytes(data)
    again = _store(tmp_path)
    assert again.problems and "indexCount" in again.problems[0]
    assert again.query("T", "k", 64, 0, 2**62) == []  # nothing wrong is returned
    assert again.last_update_phy_offset == -1  # so the tailer re-indexes that range
    again.close()


def test_checkpoint_round_trip_and_unreadable_checkpoint(tmp_path: Path) -> None:
    cp = IndexCheckpoint(tmp_path / "checkpoint")
    assert cp.offset == 0
    cp.save(1234, 99)
    again = IndexCheckpoint(tmp_path / "checkpoint")
    assert (again.offset, again.timestamp) == (1234, 99)
    (tmp_path / "checkpoint").write_text("{garbage")
    broken = IndexCheckpoint(tmp_path / "checkpoint")
    assert broken.offset == 0 and "unreadable" in broken.problem


def test_batch_indexing_equals_one_by_one(tmp_path: Path) -> None:
    records = [D(i * 10, keys=f"k{i % 4} all", unique_key=f"U{i}", store_timestamp=1_700_000_000_000 + i * 700) for i in range(40)]
    records.insert(5, D(55, keys="k1", sys_flag=SYSFLAG_TRANSACTION_ROLLBACK))
    one = IndexStore.open(tmp_path / "one", IndexStoreConfig(hash_slot_num=7, index_num=30))
    for r in records:
        one.index_record(r)
    batch = IndexStore.open(tmp_path / "batch", IndexStoreConfig(hash_slot_num=7, index_num=30))
    batch.index_records(records[:17])
    batch.index_records(records[10:])  # overlapping re-delivery
    for key in ("k0", "k1", "all", "U3", "U39"):
        assert batch.query("T", key, 64, 0, 2**62) == one.query("T", key, 64, 0, 2**62), key
    assert [f.entries for f in batch.file_infos()] == [f.entries for f in one.file_infos()]
    one.close()
    batch.close()


def test_disk_cap_drops_the_oldest_file_and_says_so(tmp_path: Path) -> None:
    s = IndexStore.open(tmp_path / "index", IndexStoreConfig(hash_slot_num=7, index_num=5, max_files=2))
    for off in range(20):
        s.index_record(D(off * 10, keys="k"))
    assert len(s.file_infos()) == 2 and len(list((tmp_path / "index").iterdir())) == 2
    assert any("cap of 2 files reached" in p for p in s.problems)
    s.close()


def test_files_below_the_log_minimum_are_deleted(tmp_path: Path) -> None:
    s = IndexStore.open(tmp_path / "index", IndexStoreConfig(hash_slot_num=7, index_num=5))
    for off in range(20):
        s.index_record(D(off * 10, keys="k"))
    before = s.file_infos()
    dropped = s.delete_below(before[2].begin_phy_offset)
    assert dropped == 2 and s.file_infos() == before[2:]
    s.close()


def test_a_corrupt_middle_file_is_rebuilt_from_the_last_good_one(tmp_path: Path) -> None:
    s = IndexStore.open(tmp_path / "index", IndexStoreConfig(hash_slot_num=7, index_num=5))
    for off in range(16):
        s.index_record(D(off * 10, keys="k"))
    infos = s.file_infos()
    s.close()
    assert len(infos) >= 3
    victim = tmp_path / "index" / infos[1].name
    raw = bytearray(victim.read_bytes())
    struct.pack_into(">i", raw, 32, -5)  # hashSlotCount negative
    victim.write_bytes(raw)
    again = IndexStore.open(tmp_path / "index", IndexStoreConfig(hash_slot_num=7, index_num=5))
    assert [f.name for f in again.file_infos()] == [infos[0].name]
    assert again.rebuild_from == infos[0].end_phy_offset
    # Re-delivery from there restores every entry exactly once.
    for off in range(16):
        if off * 10 >= again.rebuild_from:
            again.index_record(D(off * 10, keys="k"))
    assert again.query("T", "k", 64, 0, 2**62) == [off * 10 for off in range(15, -1, -1)]
    again.close()


def test_open_checkpoint_migrates_quarrys_old_file_and_refuses_a_foreign_one(tmp_path: Path) -> None:
    import json

    import pytest

    from quarry.services.indexer.checkpoint import FILE_NAME, ForeignStoreError, open_checkpoint

    (tmp_path / "checkpoint").write_text(json.dumps({"next_offset": 77, "timestamp": 5}))
    cp = open_checkpoint(tmp_path)
    assert (cp.offset, cp.path.name) == (77, FILE_NAME) and not (tmp_path / "checkpoint").exists()
    # A crash after the new file was written but before the old one went: the new one wins.
    (tmp_path / "checkpoint").write_text(json.dumps({"next_offset": 1, "timestamp": 1}))
    assert open_checkpoint(tmp_path).offset == 77 and not (tmp_path / "checkpoint").exists()
    # Read-only reads an old file where it is and writes nothing.
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "checkpoint").write_text(json.dumps({"next_offset": 9, "timestamp": 1}))
    assert open_checkpoint(ro, read_only=True).offset == 9 and sorted(p.name for p in ro.iterdir()) == ["checkpoint"]
    # Anything else named `checkpoint` (RocketMQ's is a binary page) is not Quarry's: refused, untouched.
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "checkpoint").write_bytes(bytes(4096))
    with pytest.raises(ForeignStoreError, match="not a Quarry checkpoint"):
        open_checkpoint(foreign)
    assert (foreign / "checkpoint").read_bytes() == bytes(4096) and sorted(p.name for p in foreign.iterdir()) == ["checkpoint"]


def test_a_flush_syncs_every_file_sealed_since_the_last_and_the_current_one(tmp_path: Path) -> None:
    s = _store(tmp_path)
    for i in range(30):  # 9 entries a file: four files, three of them sealed
        s.index_record(D(i * 100, keys="k", store_timestamp=1_700_000_000_000 + i))
    names = [f.path.name for f in s.files]
    synced = [f.path.name for f in s.prepare_flush()]  # the files the flush then syncs
    assert synced == names  # nothing rolled was left out (the old flush covered the last two)
    synced = [f.path.name for f in s.prepare_flush()]
    assert synced == names[-1:]
    s.close()


def test_the_tailers_flush_writes_to_disk_without_holding_the_index_lock(tmp_path: Path, monkeypatch: "pytest.MonkeyPatch") -> None:
    import threading

    from quarry.formats.index_file import IndexFile
    from quarry.services.indexer.tailer import Tailer

    lock = threading.Lock()
    in_sync, release = threading.Event(), threading.Event()
    real_sync = IndexFile.sync

    def slow_sync(self: IndexFile) -> None:  # a disk that takes its time
        in_sync.set()
        assert release.wait(10)
        real_sync(self)

    monkeypatch.setattr(IndexFile, "sync", slow_sync)
    s = _store(tmp_path)
    for i in range(5):
        s.index_record(D(i * 100, keys="k", store_timestamp=1_700_000_000_000 + i))
    checkpoint = IndexCheckpoint(tmp_path / "ckpt")
    tailer = Tailer("127.0.0.1:1", s, checkpoint, 0, lock=lock)  # not started: only its flush is used
    flushing = threading.Thread(target=tailer._flush_then_checkpoint, args=(500, 1_700_000_000_004))
    flushing.start()
    try:
        assert in_sync.wait(10)
        # A query takes the lock while the disk write is under way.
        assert lock.acquire(timeout=5), "the flush held the index lock during its disk write"
        try:
            assert s.query("T", "k", 64, 0, 2**62) == [400, 300, 200, 100, 0]
        finally:
            lock.release()
    finally:
        release.set()
        flushing.join(10)
    assert IndexCheckpoint(tmp_path / "ckpt").offset == 500  # read back from the file
    s.close()
