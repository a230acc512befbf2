"""The commitlog store on real files: roll-over, queue offsets, recovery, read-only, validation."""
from __future__ import annotations

import hashlib
import ipaddress
import os
import shutil
from pathlib import Path

import pytest

from quarry.formats.dispatch import dispatch_info
from quarry.formats.record import BLANK_MAGIC, SYSFLAG_TRANSACTION_PREPARED, SYSFLAG_TRANSACTION_ROLLBACK, read_size_and_magic
from quarry.formats.scheduled import SCHEDULE_TOPIC
from quarry.formats.segment_walk import WalkResult, list_segments, walk_segments
from quarry.services.commitlog.storage.errors import Expired, InvalidArgument, NotFound, ReadOnly
from quarry.services.commitlog.storage.message_input import NewMessage
from quarry.services.commitlog.storage.store import CommitLogStore, StoreConfig
from tests.vectors import glob, golden_cases


def _open(d: Path, **kw: object) -> CommitLogStore:
    return CommitLogStore(StoreConfig(store_dir=d, segment_size=kw.pop("segment_size", 1024), **kw))  # type: ignore[arg-type]


def _msg(i: int, topic: str = "T", **kw: object) -> NewMessage:
    return NewMessage(topic=topic, body=f"body-{i}".encode() * 5, keys=[f"k{i}"], unique_key=f"U{i:04d}", **kw)  # type: ignore[arg-type]


def _crash(store: CommitLogStore) -> None:
    """What SIGKILL leaves: bytes in the files, no clean checkpoint, the abort marker."""
    store.flusher.stop()
    for seg in store.segments.segments:
        os.close(seg.fd)
    for cq in store.cqs.queues.values():
        for fd in cq.fds.values():
            os.close(fd)


def test_records_never_span_segments_and_blank_records_close_them(tmp_path: Path) -> None:
    store = _open(tmp_path)
    results = [store.append(_msg(i)) for i in range(40)]
    store.flush()
    segs = list_segments(tmp_path / "commitlog")
    assert len(segs) > 3
    for r in results:
        seg_start = max(s for s, _ in segs if s <= r.physical_offset)
        assert r.physical_offset + r.size + 8 <= seg_start + 1024
        assert store.read(r.physical_offset).unique_key == r.unique_key
    for start, path in segs[:-1]:
        data = path.read_bytes()
        walked = WalkResult()
        from_here = [x.physical_offset for x in walk_segments(tmp_path / "commitlog", from_offset=start, result=walked)]
        # A walk from any segment's start reads every record from there to the end, cleanly.
        assert from_here == [r.physical_offset for r in results if r.physical_offset >= start]
        assert walked.corruption is None and walked.end_offset == results[-1].physical_offset + results[-1].size
        blank_at = max(r.physical_offset + r.size for r in results if start <= r.physical_offset < start + 1024) - start
        assert read_size_and_magic(data, blank_at) == (1024 - blank_at, BLANK_MAGIC)
    assert [r.physical_offset for r in walk_segments(tmp_path / "commitlog")] == [r.physical_offset for r in results]
    store.close()


def test_queue_offsets_count_per_queue_and_transactions_do_not_advance(tmp_path: Path) -> None:
    store = _open(tmp_path, segment_size=1 << 20)
    a = [store.append(_msg(i, queue_id=1)) for i in range(3)]
    b = store.append(_msg(9, queue_id=2))
    prepared = store.append(_msg(10, queue_id=1, sys_flag=SYSFLAG_TRANSACTION_PREPARED))
    rollback = store.append(_msg(11, queue_id=1, sys_flag=SYSFLAG_TRANSACTION_ROLLBACK))
    after = store.append(_msg(12, queue_id=1))
    assert [r.queue_offset for r in a] == [0, 1, 2]
    assert b.queue_offset == 0
    assert prepared.queue_offset == 0 and rollback.queue_offset == 0
    assert after.queue_offset == 3
    recs, _next, lo, hi = store.pull("T", 1, 0, 10)
    assert [r.unique_key for r in recs] == ["U0000", "U0001", "U0002", "U0012"] and (lo, hi) == (0, 4)
    store.close()


def test_round_robin_spreads_over_the_default_four_queues(tmp_path: Path) -> None:
    store = _open(tmp_path, segment_size=1 << 20)
    qids = [store.append(_msg(i)).queue_id for i in range(8)]
    assert sorted(set(qids)) == [0, 1, 2, 3]
    assert store.topics == {"T": 4}
    store.close()
    assert _open(tmp_path, segment_size=1 << 20).topics == {"T": 4}


def test_clean_restart_does_not_rescan_and_keeps_going(tmp_path: Path) -> None:
    store = _open(tmp_path)
    first = [store.append(_msg(i)) for i in range(10)]
    store.close()
    again = _open(tmp_path)
    assert not again.recovered and again.write_offset == first[-1].physical_offset + first[-1].size
    end = first[-1].physical_offset + first[-1].size
    nxt = again.append(_msg(10))
    # Right where the log ended, or at the next segment's start when it does not fit before it.
    segment_end = end - end % 1024 + 1024
    assert nxt.physical_offset == (end if end + nxt.size + 8 <= segment_end else segment_end)
    assert again.read(first[3].physical_offset).unique_key == "U0003"
    again.close()


def test_recovery_truncates_a_torn_write(tmp_path: Path) -> None:
    store = _open(tmp_path)
    acked = [store.append(_msg(i)) for i in range(12)]
    end = store.write_offset
    seg = store.segments.find(end - 1)
    assert seg is not None
    # A record half written when the process died: a valid header, then nothing.
    torn = bytearray(store.read(acked[-1].physical_offset).store_size.to_bytes(4, "big")) + (0xDAA320A7).to_bytes(4, "big") + b"\x01" * 20
    seg.write(end, torn)
    _crash(store)
    again = _open(tmp_path)
    assert again.recovered and again.write_offset == end
    assert [again.read(r.physical_offset).unique_key for r in acked] == [r.unique_key for r in acked]
    assert any("corrupt" in c or "TOTALSIZE" in c or "BODYLEN" in c for c in again.status().corruption)
    assert again.append(_msg(99)).physical_offset == end
    again.close()


def test_recovery_cuts_a_tail_record_whose_crc_fails_and_rebuilds_queues(tmp_path: Path) -> None:
    # No flush after open: the checkpoint stays at 0, as when the crash comes before the next flush.
    store = _open(tmp_path, segment_size=1 << 20, flush_interval_ms=600_000)
    acked = [store.append(_msg(i, queue_id=0)) for i in range(5)]
    last = acked[-1]
    seg = store.segments.find(last.physical_offset)
    assert seg is not None
    seg.write(last.physical_offset + 90, b"\xff")  # a flipped byte in the body (it starts at 88)
    _crash(store)
    again = _open(tmp_path, segment_size=1 << 20, flush_interval_ms=600_000)
    assert again.write_offset == last.physical_offset
    assert any("CRC" in c for c in again.status().corruption)
    with pytest.raises(NotFound):
        again.read(last.physical_offset)
    recs, _, _, hi = again.pull("T", 0, 0, 10)
    assert hi == 4 and [r.unique_key for r in recs] == [r.unique_key for r in acked[:4]]
    again.close()


def test_mid_log_crc_corruption_is_reported_not_silently_skipped(tmp_path: Path) -> None:
    store = _open(tmp_path, segment_size=1 << 20)
    acked = [store.append(_msg(i, queue_id=0)) for i in range(5)]
    bad = acked[2]
    seg = store.segments.find(bad.physical_offset)
    assert seg is not None
    store.flush()
    seg.write(bad.physical_offset + 90, b"\xff")
    _crash(store)
    os.unlink(tmp_path / "quarry-checkpoint.json")  # force a full rescan
    again = _open(tmp_path, segment_size=1 << 20)
    assert again.write_offset == acked[-1].physical_offset + acked[-1].size
    problems = again.status().corruption
    assert any(str(bad.physical_offset) in p and "CRC" in p for p in problems)
    with pytest.raises(NotFound, match="corrupt"):
        again.read(bad.physical_offset)
    assert again.read(acked[3].physical_offset).unique_key == "U0003"
    again.close()


def _golden_stores(root: Path) -> list[object]:
    return [pytest.param(p, id=p.parent.name) for p in glob("messages/*/commitlog")]


@golden_cases("scenario", _golden_stores)
def test_read_only_open_of_a_rocketmq_store_changes_no_byte(scenario: Path, tmp_path: Path) -> None:
    store_dir = tmp_path / scenario.parent.name
    shutil.copytree(scenario, store_dir / "commitlog")
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (store_dir / "commitlog").iterdir()}
    listing = sorted(str(p.relative_to(store_dir)) for p in store_dir.rglob("*"))
    seg_size = (store_dir / "commitlog" / sorted(before)[0]).stat().st_size
    store = CommitLogStore(StoreConfig(store_dir=store_dir, segment_size=seg_size, read_only=True))
    offsets = [r.physical_offset for r in walk_segments(store_dir / "commitlog")]
    assert offsets, f"{scenario} holds no record"
    assert [store.read(o).physical_offset for o in offsets] == offsets
    with pytest.raises(ReadOnly):
        store.append(_msg(1))
    store.close()
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (store_dir / "commitlog").iterdir()} == before
    assert sorted(str(p.relative_to(store_dir)) for p in store_dir.rglob("*")) == listing


def test_reads_at_bad_offsets_never_decode_garbage(tmp_path: Path) -> None:
    store = _open(tmp_path, segment_size=1 << 20)
    r = store.append(_msg(1))
    with pytest.raises(NotFound, match=str(r.physical_offset + 3)):
        store.read(r.physical_offset + 3)
    with pytest.raises(NotFound, match="past the end"):
        store.read(10_000)
    with pytest.raises(InvalidArgument, match="physical_offset"):
        store.read(-1)
    store.close()


def test_expired_segments_are_deleted_and_reads_below_say_so(tmp_path: Path) -> None:
    store = _open(tmp_path, file_reserved_hours=1.0)
    rs = [store.append(_msg(i)) for i in range(30)]
    old = list_segments(tmp_path / "commitlog")[0][1]
    os.utime(old, (0, 0))
    assert store.delete_expired() == 1
    with pytest.raises(Expired, match="expired"):
        store.read(rs[0].physical_offset)
    assert store.read(rs[-1].physical_offset).unique_key == rs[-1].unique_key
    store.close()


@pytest.mark.parametrize(
    ("msg", "field"),
    [
        (NewMessage(topic="bad topic", body=b"x"), "topic"),
        (NewMessage(topic="T" * 128, body=b"x"), "topic"),
        (NewMessage(topic="", body=b"x"), "topic"),
        (NewMessage(topic="T", body=b""), "body"),
        (NewMessage(topic="T", body=b"x" * 2049), "body"),
        (NewMessage(topic="T", body=b"x", properties=[("a\x01", "v")]), "properties[0].name"),
        (NewMessage(topic="T", body=b"x", properties=[("a", "v\x02")]), "properties[0].value"),
        (NewMessage(topic="T", body=b"x", properties=[("a", "v" * 40000)]), "properties"),
        (NewMessage(topic="T", body=b"x", keys=["has space"]), "keys[0]"),
        (NewMessage(topic="T", body=b"x", keys=["ok", ""]), "keys[1]"),
        (NewMessage(topic="T", body=b"x", keys=["ok", "a\x01b"]), "keys[1]"),
        (NewMessage(topic="T", body=b"x", tags="t\x02"), "tags"),
        (NewMessage(topic="T", body=b"x", unique_key="u\x01"), "unique_key"),
        (NewMessage(topic="T", body=b"x", properties=[("", "v")]), "properties[0].name"),
        (NewMessage(topic="T", body=b"x", properties=[("KEYS", "v")]), "properties[0].name"),
        (NewMessage(topic="T", body=b"x", reconsume_times=-1), "reconsume_times"),
        (NewMessage(topic="T", body=b"x", prepared_transaction_offset=-1), "prepared_transaction_offset"),
        (NewMessage(topic="T", body=b"x", born_host=("127.0.0.1", 70000)), "born_host.port"),
        (NewMessage(topic="T", body=b"x", queue_id=7), "queue_id"),
        (NewMessage(topic="T", body=b"x", queue_id=-2), "queue_id"),
        (NewMessage(topic="T", body=b"x", born_timestamp=-1), "born_timestamp"),
        # Past their record fields' widths (a struct.error from deep in the append before).
        (NewMessage(topic="T", body=b"x", born_timestamp=1 << 63), "born_timestamp"),
        (NewMessage(topic="T", body=b"x", prepared_transaction_offset=1 << 63), "prepared_transaction_offset"),
        (NewMessage(topic="T", body=b"x", reconsume_times=1 << 31), "reconsume_times"),
        (NewMessage(topic="T", body=b"x", flag=1 << 31), "flag"),
        (NewMessage(topic="T", body=b"x", flag=-(1 << 31) - 1), "flag"),
    ],
)
def test_bad_input_is_rejected_naming_the_field_and_nothing_is_stored(tmp_path: Path, msg: NewMessage, field: str) -> None:
    store = _open(tmp_path, max_message_size=2048)
    store.append(_msg(0))
    end = store.write_offset
    with pytest.raises(InvalidArgument) as err:
        store.append(msg)
    assert err.value.field.startswith(field), err.value
    assert store.write_offset == end
    store.close()


def test_a_bad_message_in_a_batch_is_named_by_its_index(tmp_path: Path) -> None:
    store = _open(tmp_path, segment_size=1 << 20)
    with pytest.raises(InvalidArgument) as err:
        store.append_many([_msg(0), _msg(1), NewMessage(topic="T", body=b"x", tags="a\x01")])
    assert err.value.field == "messages[2].tags"
    assert store.write_offset == 0
    store.close()


@pytest.mark.parametrize(("born", "store_host"), [
    (("::1", 4321), ("127.0.0.1", 10911)),
    (("127.0.0.1", 4321), ("fe80::1", 10911)),
    (("2001:db8::7", 4321), ("2001:db8::8", 10911)),
])
def test_ipv6_hosts_keep_every_field_in_place(tmp_path: Path, born: tuple[str, int], store_host: tuple[str, int]) -> None:
    # The store time sits after the born host, whose size depends on its family.
    store = _open(tmp_path, segment_size=1 << 20, store_host=store_host)
    results = store.append_many([NewMessage(topic="T", body=b"v6", keys=["k"], born_host=born, born_timestamp=1234) for _ in range(3)])
    for r in results:
        rec = store.read(r.physical_offset)
        # decoded as Java prints an address (0:0:0:0:0:0:0:1)
        assert [(ipaddress.ip_address(h), port) for h, port in (rec.born_host, rec.store_host)] == [(ipaddress.ip_address(h), port) for h, port in (born, store_host)]
        assert (rec.born_timestamp, rec.store_timestamp) == (1234, r.store_timestamp)
        assert (rec.queue_id, rec.queue_offset, rec.physical_offset) == (r.queue_id, r.queue_offset, r.physical_offset)
    store.close()


def test_a_record_larger_than_a_segment_is_refused_not_split(tmp_path: Path) -> None:
    store = _open(tmp_path, segment_size=4096)
    store.append(_msg(0))
    with pytest.raises(InvalidArgument) as err:
        store.append_many([_msg(1), NewMessage(topic="T", body=b"x" * 4096)])
    assert err.value.field == "messages[1].body" and "4096-byte segment" in str(err.value)
    assert [s.start for s in store.segments.segments] == [0]
    largest = 4096 - 8 - 91 - 1  # segment - blank header - fixed fields - topic "T"
    with pytest.raises(InvalidArgument):
        store.append(NewMessage(topic="T", body=b"x" * (largest + 1)))
    fits = store.append(NewMessage(topic="T", body=b"x" * largest))  # fills a new segment exactly
    assert store.read(fits.physical_offset).body == b"x" * largest
    store.close()


@pytest.mark.parametrize(("topic", "tags", "props"), [
    ("T", "paid", []),
    ("T", "", []),
    (SCHEDULE_TOPIC, "paid", [("DELAY", "3")]),  # tagsCode = deliver time
])
def test_consume_queue_tags_code_is_what_the_dispatch_rule_says(tmp_path: Path, topic: str, tags: str, props: list[tuple[str, str]]) -> None:
    store = _open(tmp_path, segment_size=1 << 20)
    r = store.append(NewMessage(topic=topic, body=b"x", tags=tags, properties=props, queue_id=0))
    ((_phy, _size, code),) = store.cqs.queue(topic, 0).read_units(r.queue_offset, 1)
    assert code == dispatch_info(store.read(r.physical_offset)).tags_code
    if props:
        assert code == r.store_timestamp + 10_000
    store.close()


def test_a_127_byte_topic_is_accepted(tmp_path: Path) -> None:
    store = _open(tmp_path, segment_size=1 << 20)
    r = store.append(NewMessage(topic="T" * 127, body=b"x"))
    assert store.read(r.physical_offset).topic == "T" * 127
    store.close()


def test_batch_mixing_topics_is_rejected(tmp_path: Path) -> None:
    store = _open(tmp_path, segment_size=1 << 20)
    with pytest.raises(InvalidArgument, match=r"messages\[1\].topic"):
        store.append_many([_msg(1, topic="A"), _msg(2, topic="B")])
    assert store.write_offset == 0
    store.close()


def test_topic_creation_can_be_switched_off(tmp_path: Path) -> None:
    store = _open(tmp_path, auto_create_topics=False)
    with pytest.raises(NotFound, match="auto-creation is off"):
        store.append(_msg(1))
    store.close()


def test_sync_flush_acknowledges_after_fsync(tmp_path: Path) -> None:
    store = _open(tmp_path, segment_size=1 << 20, flush_mode="SYNC", flush_interval_ms=10_000)
    r = store.append(_msg(1))
    assert r.flushed and store.flushed_offset >= r.physical_offset + r.size
    store.close()


def test_a_damaged_consume_queue_unit_never_returns_another_message(tmp_path: Path) -> None:
    store = _open(tmp_path, segment_size=1 << 20)
    rs = [store.append(_msg(i, queue_id=0)) for i in range(4)]
    cq = store.cqs.existing("T", 0)
    assert cq is not None
    from quarry.formats.consume_queue import encode_unit

    cq.write_units(1, encode_unit(rs[3].physical_offset, rs[3].size, 0))  # unit 1 now points at message 3
    recs, next_offset, _, _ = store.pull("T", 0, 0, 10)
    assert [r.queue_offset for r in recs] == [0, 2, 3]
    assert next_offset == 4  # past the skipped unit too: the consumer neither repeats nor sticks
    assert any("unit 1 points at" in c for c in store.status().corruption)
    assert store.pull("T", 0, 2, 1)[:2] == ([recs[1]], 3)
    assert store.pull("T", 0, 9, 5)[1] == 4  # past the end: the end
    store.close()


def test_health_says_not_serving_when_the_flusher_fails_or_is_gone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Health from the store's state (the commitlog's health service answers this)."""
    import threading

    from quarry.services.commitlog.storage import flushing
    from quarry.services.commitlog.health import store_health

    store = _open(tmp_path / "s", flush_interval_ms=10)
    store.append(_msg(1))
    assert store_health(store) == ""
    flushed = threading.Event()

    def broken_checkpoint(*args: object, **kwargs: object) -> None:
        flushed.set()
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(flushing, "save_checkpoint", broken_checkpoint)
    store.append(_msg(2))
    assert flushed.wait(10)
    deadline = threading.Event()
    for _ in range(200):  # the flusher records the failure right after the call raised
        if store_health(store):
            break
        deadline.wait(0.05)
    assert store_health(store).startswith("flusher failing: OSError(5")
    monkeypatch.undo()
    store.append(_msg(3))
    for _ in range(200):
        if not store_health(store):
            break
        deadline.wait(0.05)
    assert store_health(store) == ""
    store.flusher.stop()  # the thread gone: nothing written would ever become durable
    assert "flusher thread is not running" in store_health(store)
    store.close()
    assert store_health(_open(tmp_path / "s", read_only=True)) == ""  # read-only needs no flusher
