"""Follow mode on a real directory written by the test as a RocketMQ broker writes it
(tests/store_writer.Writer: preallocated zero-filled segments, mmap writes in pieces).
The follower's thread is kept idle (a long interval) and `poll()` is called by the test,
so each half-written state is looked at on purpose."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from quarry.formats.properties import KEYS, UNIQ_KEY, encode_properties
from quarry.formats.record import encode_record
from quarry.services.commitlog.errors import Expired, NotFound
from quarry.services.commitlog.store import CommitLogStore, StoreConfig
from tests.store_writer import Writer
from tests.tree import tree_snapshot

SEG = 4096


def _record(n: int, at: int, queue_offset: int, queue_id: int = 0) -> bytes:
    props = encode_properties([(KEYS, f"key-{n}"), (UNIQ_KEY, f"{n:032X}")])
    return encode_record(topic="T", body=b"body %d " % n * 5, properties=props, queue_id=queue_id, flag=0, queue_offset=queue_offset,
                         physical_offset=at, sys_flag=0, born_timestamp=1_700_000_000_000 + n, born_host=("10.0.0.1", 1),
                         store_timestamp=1_700_000_000_000 + n, store_host=("10.9.8.7", 10911))


@pytest.fixture
def writer(tmp_path: Path) -> Writer:
    return Writer(tmp_path / "broker", SEG, 0.0, 0)


def _follow(writer: Writer) -> CommitLogStore:
    # A long interval: the thread never polls during the test; the test calls poll().
    return CommitLogStore(StoreConfig(store_dir=writer.dir.parent, follow=True, follow_interval_ms=3_600_000))


def test_a_record_is_served_only_once_whole_and_its_crc_holds(writer: Writer) -> None:
    writer.open_segment(0)
    store = _follow(writer)
    try:
        assert store.write_offset == 0 and store.read_only
        data = _record(0, 0, 0)
        for cut in (4, 8, 30, len(data) - 40, len(data) - 1):  # header only, ..., all but the last property byte
            writer.write(0, data[:cut], pieces=1)
            store.follower.poll()
            assert store.write_offset == 0, f"a record cut at {cut} bytes was served"
            with pytest.raises(NotFound):
                store.read(0)
        writer.write(0, data, pieces=1)
        assert store.follower.poll() == 1
        assert store.write_offset == len(data)
        rec = store.read(0)
        assert rec.keys == ["key-0"] and rec.unique_key == f"{0:032X}"
        records, _next, lo, hi = store.pull("T", 0, 0, 10)
        assert [r.physical_offset for r in records] == [0] and (lo, hi) == (0, 1)
        assert ("10.9.8.7", 10911) in store.state.store_hosts_seen
    finally:
        store.close()


def test_segments_roll_blank_preallocation_and_expiry(writer: Writer) -> None:
    os.makedirs(writer.dir, exist_ok=True)
    half = writer.dir / "00000000000000000000"
    with open(half, "wb") as fh:  # a file caught while it is being preallocated
        fh.truncate(SEG // 4)
    store = _follow(writer)
    try:
        store.follower.poll()
        assert store.write_offset == 0
        offset, qoff, written = 0, 0, []
        for n in range(80):
            writer.open_segment(offset - offset % SEG)
            data = _record(n, offset, qoff)
            if len(data) + 8 > writer.room(offset):
                offset = writer.close_segment(offset)
                writer.open_segment(offset)
                data = _record(n, offset, qoff)
            writer.write(offset, data)
            written.append(offset)
            offset += len(data)
            qoff += 1
            store.follower.poll()
        assert store.write_offset == offset
        assert len({o // SEG for o in written}) >= 3
        for n, at in enumerate(written):
            assert store.read(at).keys == [f"key-{n}"]
        records, *_ = store.pull("T", 0, 0, 100)
        assert [r.physical_offset for r in records] == written
        infos, nxt = store.read_dispatch(0, 1000, store.committed_offset)
        assert [d.physical_offset for d in infos] == written and nxt == offset

        # The writer deletes its oldest segment: the minimum moves, reads there are out of range.
        os.unlink(writer.dir / "00000000000000000000")
        store.follower.poll()
        assert store.min_offset == SEG
        with pytest.raises(Expired):
            store.read(written[0])
        kept = [i for i, at in enumerate(written) if at >= SEG]
        records, _next, lo, _hi = store.pull("T", 0, 0, 100)
        assert lo == kept[0] and [r.physical_offset for r in records] == []
        records, *_ = store.pull("T", 0, lo, 100)
        assert [r.physical_offset for r in records] == [written[i] for i in kept]
    finally:
        store.close()


def test_a_torn_record_written_over_after_a_writer_crash(writer: Writer) -> None:
    writer.open_segment(0)
    first = _record(0, 0, 0)
    writer.write(0, first)
    torn = _record(1, len(first), 1)
    writer.write(len(first), torn[: len(torn) // 2])  # the writer died here
    store = _follow(writer)
    try:
        assert store.write_offset == len(first)
        # Restarted, the writer puts another record where the torn one was.
        again = _record(7, len(first), 1)
        writer.write(len(first), again)
        store.follower.poll()
        assert store.write_offset == len(first) + len(again)
        assert store.read(len(first)).keys == ["key-7"]
    finally:
        store.close()


def test_the_directory_is_opened_read_only_and_never_changed(writer: Writer) -> None:
    writer.open_segment(0)
    writer.write(0, _record(0, 0, 0))
    root = writer.dir.parent
    before = tree_snapshot(root)
    store = _follow(writer)
    try:
        store.follower.poll()
        assert store.write_offset > 0
        # The test's own writer shares this process (and mmap dups its descriptors): look at
        # the store's. The e2e test checks every descriptor of a separate commitlog process.
        ours = [(seg.fd, os.readlink(f"/proc/self/fd/{seg.fd}")) for seg in store.segments.segments]
        assert ours, "the follower holds the segments open"
        for fd, target in ours:
            flags = int(Path(f"/proc/self/fdinfo/{fd}").read_text().split("flags:")[1].split()[0], 8)
            assert flags & os.O_ACCMODE == os.O_RDONLY, f"{target} open with flags {flags:o}"
        assert stat.S_ISDIR(os.stat(root).st_mode)
    finally:
        store.close()
    assert tree_snapshot(root) == before  # nothing written, created or touched


def test_the_writers_consume_queue_files_answer_and_memory_fills_in_what_they_lack(tmp_path: Path) -> None:
    from quarry.formats.consume_queue import encode_unit
    from quarry.services.commitlog.followed_queue import FollowedConsumeQueue

    d = tmp_path / "consumequeue" / "T" / "0"
    d.mkdir(parents=True)
    units_per_file = 4
    (d / "00000000000000000000").write_bytes(b"".join(encode_unit(100 * i, 10, 0) for i in range(3)) + bytes(20))
    cq = FollowedConsumeQueue(d, units_per_file)
    assert (cq.files.min_offset, cq.files.max_offset) == (0, 3)
    assert cq.max_offset == 0  # nothing handed out before the follower has read those records
    for i in range(6):  # the follower reads records 0..5 from the CommitLog
        cq.write_units(i, encode_unit(100 * i, 10, 0))
    assert (cq.min_offset, cq.max_offset) == (0, 6)
    assert [u[0] for u in cq.read_units(0, 10)] == [0, 100, 200, 300, 400, 500]  # 0..2 from the file, 3..5 from memory
    assert (cq.memory.min_offset, cq.memory.max_offset) == (3, 6)

    # The writer catches up (and rolls to a second file): memory keeps only what the files lack.
    with open(d / "00000000000000000000", "r+b") as fh:
        fh.seek(60)
        fh.write(encode_unit(300, 10, 0))
    (d / "00000000000000000080").write_bytes(encode_unit(400, 10, 0) + bytes(60))
    cq.refresh()
    assert cq.files.max_offset == 5 and (cq.memory.min_offset, cq.memory.max_offset) == (5, 6)
    assert [u[0] for u in cq.read_units(0, 10)] == [0, 100, 200, 300, 400, 500]
    assert [u[0] for u in cq.read_units(4, 1)] == [400]

    # The writer deletes its first file (its CommitLog expired): the minimum moves.
    (d / "00000000000000000000").unlink()
    cq.refresh()
    assert cq.min_offset == 4 and [u[0] for u in cq.read_units(4, 10)] == [400, 500]
    cq.close()


def test_a_record_that_stays_broken_is_reported_once_and_health_names_a_dead_follower(writer: Writer, monkeypatch: pytest.MonkeyPatch) -> None:
    from quarry.services.commitlog import follow
    from quarry.services.commitlog.health import store_health

    monkeypatch.setattr(follow, "STUCK_REPORT_S", 0.0)
    writer.open_segment(0)
    data = bytearray(_record(0, 0, 0))
    data[-30] ^= 0xFF  # never whole: its body CRC fails for good
    writer.write(0, bytes(data))
    store = _follow(writer)
    try:
        for _ in range(3):
            store.follower.poll()
        assert store.write_offset == 0
        assert len([c for c in store.corruption if "record at 0 still unreadable" in c]) == 1
        assert store_health(store) == ""
        store.follower.stop()
        assert "follower thread is not running" in store_health(store)
    finally:
        store.close()
