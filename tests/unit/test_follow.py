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
from quarry.services.commitlog.storage import follow
from quarry.services.commitlog.storage.errors import Expired, NotFound
from quarry.services.commitlog.storage.store import CommitLogStore, StoreConfig
from quarry.services.progress import Progress
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
    from quarry.services.commitlog.storage.followed_queue import FollowedConsumeQueue

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
    from quarry.services.commitlog.storage import follow
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


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _watch(store: CommitLogStore, clock: FakeClock) -> Progress:
    """The follower's progress on a clock the test moves."""
    assert store.follower is not None
    store.follower.progress = Progress("follower", "bytes", stall_after_s=follow.STUCK_REPORT_S, clock=clock)
    return store.follower.progress


def _write_records(writer: Writer, offset: int, numbers: range, next_qoff: list[int], written: dict[int, int]) -> int:
    """Records `numbers` (queue n % 2) from `offset`, rolling to the next segment as RocketMQ
    does (a blank, then the next file); `written` maps offset -> number. Returns the end."""
    for n in numbers:
        qid = n % 2
        data = _record(n, offset, next_qoff[qid], queue_id=qid)
        if len(data) + 8 > writer.room(offset):
            offset = writer.close_segment(offset)
            data = _record(n, offset, next_qoff[qid], queue_id=qid)
        writer.open_segment(offset - offset % SEG)
        writer.write(offset, data)
        written[offset] = n
        next_qoff[qid] += 1
        offset += len(data)
    return offset


def _crash_recovery(writer: Writer, cut: int) -> None:
    """What RocketMQ's recovery does to the files: the files after the one holding the last
    whole record are deleted (the preallocated next one too), and that one's bytes after the
    record are cut (zeroed, in place)."""
    seg_start = cut - cut % SEG
    for start in sorted(writer.maps):
        if start > seg_start:
            fd, mm = writer.maps.pop(start)
            mm.close()
            os.close(fd)
            os.unlink(writer.dir / f"{start:020d}")
    writer.write(cut, bytes(SEG - cut % SEG), pieces=1)


def _served(store: CommitLogStore) -> list[tuple[int, str]]:
    """(offset, key) of every record the store hands out through Tail's dispatch reads."""
    infos, _next = store.read_dispatch(store.min_offset, 10_000, store.committed_offset)
    return [(d.physical_offset, store.read(d.physical_offset).keys[0]) for d in infos]


@pytest.mark.parametrize("poll_during_recovery", [True, False], ids=["followed-through-each-step", "looked-at-only-after"])
def test_a_crash_recovery_that_cuts_the_log_back_and_reallocates_the_next_file(writer: Writer, poll_during_recovery: bool) -> None:
    clock = FakeClock()
    next_qoff = [0, 0]
    before: dict[int, int] = {}
    end = _write_records(writer, 0, range(10), next_qoff, before)  # all in the first file; the next one preallocated
    assert end < SEG and (writer.dir / f"{SEG:020d}").exists()
    store = _follow(writer)
    try:
        progress = _watch(store, clock)
        store.follower.poll()
        assert store.write_offset == end and len(_served(store)) == 10
        kept = [at for at, n in sorted(before.items()) if n < 7]
        cut = sorted(before)[7]  # records 7, 8, 9 are lost in the broker's crash

        _crash_recovery(writer, cut)
        if poll_during_recovery:
            store.follower.poll()
            assert store.write_offset == cut
            assert [at for at, _k in _served(store)] == kept
            with pytest.raises(NotFound):
                store.read(sorted(before)[8])
            records, *_ = store.pull("T", 1, 0, 100)  # queue 1 held records 1, 3, 5, 7, 9
            assert [r.keys for r in records] == [["key-1"], ["key-3"], ["key-5"]]

        # The restarted broker writes other records from the cut (queue offsets going on from
        # the whole records), fills the file and allocates the next one again under its name.
        next_qoff = [4, 3]
        after: dict[int, int] = {}
        end = _write_records(writer, cut, range(100, 130), next_qoff, after)
        assert end > SEG  # into the file allocated again
        store.follower.poll()

        expected = [(at, f"key-{before[at]}") for at in kept] + [(at, f"key-{n}") for at, n in sorted(after.items())]
        assert _served(store) == expected
        assert store.write_offset == end
        for at, n in before.items():
            if n >= 7 and at not in after:
                with pytest.raises(NotFound):
                    store.read(at)  # a dropped record's offset is no record start any more
        for qid in (0, 1):
            records, *_ = store.pull("T", qid, 0, 100)
            want = [f"key-{n}" for n in sorted(before.values()) if n < 7 and n % 2 == qid] + \
                   [f"key-{n}" for n in sorted(after.values()) if n % 2 == qid]
            assert [r.keys[0] for r in records] == want
            assert [r.queue_offset for r in records] == list(range(len(want)))
        cuts = [c for c in store.corruption if "cut back" in c]
        assert len(cuts) == 1 and f"cut back to {cut}" in cuts[0] and "3 records" in cuts[0], store.corruption
        # The new file is read through a descriptor of its own, not the deleted one's.
        assert all(not os.readlink(f"/proc/self/fd/{s.fd}").endswith("(deleted)") for s in store.segments.segments)

        # Caught up: no stall however long nothing is written.
        clock.now += 3600
        assert progress.check() == "" and progress.position == end and progress.input_end == end
    finally:
        store.close()


def test_a_record_that_stays_unreadable_while_the_writer_goes_on_stalls_the_follower(writer: Writer) -> None:
    clock = FakeClock()
    next_qoff = [0, 0]
    written: dict[int, int] = {}
    end = _write_records(writer, 0, range(3), next_qoff, written)
    store = _follow(writer)
    try:
        progress = _watch(store, clock)
        store.follower.poll()
        assert progress.position == end and progress.check() == ""
        broken = bytearray(_record(3, end, next_qoff[1], queue_id=1))
        broken[-30] ^= 0xFF  # its body CRC fails for good
        writer.write(end, bytes(broken))
        next_qoff[1] += 1
        more = _write_records(writer, end + len(broken), range(4, 40), next_qoff, written)
        assert more > SEG  # the writer's files reach into the next file
        store.follower.poll()
        assert store.write_offset == end
        assert progress.input_end > end
        assert progress.check() == "" and not [c for c in store.corruption if "unreadable" in c]  # not yet: it may be mid-write
        clock.now += follow.STUCK_REPORT_S + 1
        store.follower.poll()
        stalled = progress.check()
        assert stalled.startswith("follower stalled") and f"record at {end} unreadable" in stalled, stalled
        store.follower.poll()
        assert len([c for c in store.corruption if f"record at {end} still unreadable" in c]) == 1
    finally:
        store.close()


def test_the_writers_queue_units_past_a_cut_are_handed_out_only_once_written_again(tmp_path: Path) -> None:
    from quarry.formats.consume_queue import encode_unit
    from quarry.services.commitlog.storage.followed_queue import FollowedConsumeQueue

    d = tmp_path / "consumequeue" / "T" / "0"
    d.mkdir(parents=True)
    first = d / "00000000000000000000"
    first.write_bytes(b"".join(encode_unit(100 * i, 10, 0) for i in range(4)))
    (d / "00000000000000000080").write_bytes(b"".join(encode_unit(100 * i, 10, 0) for i in range(4, 6)) + bytes(40))
    cq = FollowedConsumeQueue(d, 4)
    for i in range(6):
        cq.write_units(i, encode_unit(100 * i, 10, 0))
    assert cq.max_offset == 6

    # The writer's log is cut at 250: units 3.. point past it. Its recovery leaves them in its
    # files (it moves its positions) and deletes the newer queue file.
    (d / "00000000000000000080").unlink()
    cq.truncate_from_phy(250)
    assert (cq.min_offset, cq.max_offset) == (0, 3) and [u[0] for u in cq.read_units(0, 10)] == [0, 100, 200]
    # The follower reads the new records: unit 3 now points at 260, 4 at 380.
    cq.write_units(3, encode_unit(260, 12, 0))
    cq.write_units(4, encode_unit(380, 12, 0))
    cq.refresh()  # the file still holds the stale unit 3 (300): not handed out
    assert [u[0] for u in cq.read_units(0, 10)] == [0, 100, 200, 260, 380]
    # The writer writes its units again; the newer file is allocated again under its name.
    with open(first, "r+b") as fh:
        fh.seek(60)
        fh.write(encode_unit(260, 12, 0))
    (d / "00000000000000000080").write_bytes(encode_unit(380, 12, 0) + bytes(60))
    cq.refresh()
    assert cq.files.max_offset == 5 and not cq.memory.units  # the files agree: memory let go
    assert [u[0] for u in cq.read_units(0, 10)] == [0, 100, 200, 260, 380]
    cq.close()


def test_a_queues_minimum_moves_past_units_pointing_below_the_expired_commitlog(tmp_path: Path) -> None:
    """RocketMQ keeps a queue's file while any unit in it points into the CommitLog (its newest
    file always): after the log's oldest files expire, the queue's minimum is its first unit still
    pointing into the log (the broker's correctMinOffset), not the start of its oldest file, so
    an offset below it is answered as out of the valid range. A real broker showed it: a queue of
    229 units in one 300-unit file said 'valid range is [0, 229)' after expiry."""
    from quarry.formats.consume_queue import encode_unit
    from quarry.services.commitlog.storage.followed_queue import FollowedConsumeQueue

    d = tmp_path / "consumequeue" / "T" / "0"
    d.mkdir(parents=True)
    (d / "00000000000000000000").write_bytes(b"".join(encode_unit(100 * i, 10, 0) for i in range(6)) + bytes(40))
    cq = FollowedConsumeQueue(d, 8)
    for i in range(7):
        cq.write_units(i, encode_unit(100 * i, 10, 0))  # 0..5 in the file, 6 in memory
    assert (cq.min_offset, cq.max_offset) == (0, 7)
    cq.drop_below_phy(250)  # the CommitLog below 250 expired; the queue's file stays
    assert (cq.min_offset, cq.max_offset) == (3, 7)
    assert [u[0] for u in cq.read_units(cq.min_offset, 10)] == [300, 400, 500, 600]
    cq.refresh(250)
    assert cq.min_offset == 3  # stays moved
    cq.drop_below_phy(550)  # every unit expired but the last of the file and the one in memory
    assert (cq.min_offset, cq.max_offset) == (6, 7)
    cq.drop_below_phy(650)  # and that one too: an empty queue at its end
    assert (cq.min_offset, cq.max_offset) == (7, 7) and cq.read_units(7, 10) == []
    cq.close()

    # A queue first looked at after the expiry (the follower started late, or the queue is new):
    # its first refresh is told the CommitLog's minimum.
    late = FollowedConsumeQueue(d, 8)
    for i in range(6):
        late.write_units(i, encode_unit(100 * i, 10, 0))
    late.refresh(250)
    assert (late.min_offset, late.max_offset) == (3, 6)
    late.refresh(1000)  # everything expired: an empty queue at its end
    assert (late.min_offset, late.max_offset) == (6, 6) and late.read_units(6, 10) == []
    late.close()
