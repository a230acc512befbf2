"""Recovery checks what is on disk (issue 15 items 8 and 9), through the commitlog process:
files damaged between runs, then the service's status, reads, queues and files.

* A byte flipped mid-log while the commitlog was stopped is found at the next start (CRC
  checked on the newest segments, as RocketMQ's checkCRCOnRecover) and reported once, however
  often the record is read afterwards.
* A newest segment cut in the middle of its last record after SIGKILL (optionally followed by
  garbage up to its full size): the log ends at the last whole record, the checkpoint's
  claim beyond it is reported, the queue continues without a hole, every segment file is
  full-size and named by a multiple of the segment size.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2
from scripts.launcher import MODULES, free_port
from tests.e2e.conftest import Launch, wait_until

HOST = "127.0.0.63"
SEGMENT = 64 * 1024
TOPIC = "RecoveryTopic"


def _args(store: Path) -> list[str]:
    return ["--store-dir", str(store), "--segment-size", str(SEGMENT), "--flush-interval-ms", "20"]


def _send(stub: commitlog_pb2_grpc.CommitLogServiceStub, i: int, size: int = 900) -> common_pb2.SendResult:
    msg = common_pb2.MessageInput(topic=TOPIC, body=(f"m{i}-".encode() * size)[:size], keys=[f"k{i}"], queue_id=0)
    return stub.SendMessage(commitlog_pb2.SendMessageRequest(message=msg), timeout=10).result


def _status(stub: commitlog_pb2_grpc.CommitLogServiceStub) -> commitlog_pb2.GetStoreStatusResponse:
    return stub.GetStoreStatus(commitlog_pb2.GetStoreStatusRequest(), timeout=10)


def _segments(store: Path) -> list[tuple[str, int]]:
    return sorted((p.name, p.stat().st_size) for p in (store / "commitlog").iterdir())


def test_a_flipped_byte_mid_log_is_found_at_start_and_reported_once(launch: Launch, tmp_path: Path) -> None:
    store = tmp_path / "store"
    port = free_port(HOST)
    cl = launch("commitlog", *_args(store), host=HOST, port=port)
    with grpc.insecure_channel(cl.address) as ch:
        sent = [_send(commitlog_pb2_grpc.CommitLogServiceStub(ch), i) for i in range(20)]
    assert cl.stop() == 0  # a clean stop: the checkpoint says exactly where the log ends
    bad = sent[7]
    seg_start = bad.physical_offset - bad.physical_offset % SEGMENT
    with open(store / "commitlog" / f"{seg_start:020d}", "r+b") as fh:
        fh.seek(bad.physical_offset - seg_start + 200)  # inside the body
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0xFF]))

    again = launch("commitlog", *_args(store), host=HOST, port=port)
    with grpc.insecure_channel(again.address) as ch:
        stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
        found = [c for c in _status(stub).corruption if str(bad.physical_offset) in c]
        assert len(found) == 1 and "CRC" in found[0], _status(stub).corruption  # found at start, before any read
        for _ in range(3):
            with pytest.raises(grpc.RpcError):
                stub.ViewMessage(commitlog_pb2.ViewMessageRequest(physical_offset=bad.physical_offset), timeout=5)
            stub.GetMessages(commitlog_pb2.GetMessagesRequest(physical_offsets=[bad.physical_offset]), timeout=5)
        assert [c for c in _status(stub).corruption if str(bad.physical_offset) in c] == found  # still once
        assert stub.ViewMessage(commitlog_pb2.ViewMessageRequest(physical_offset=sent[8].physical_offset), timeout=5).message.keys == ["k8"]
    lines = [line for line in again.log_path.read_text().splitlines() if "corruption found" in line and str(bad.physical_offset) in line]
    assert len(lines) == 1, lines


@pytest.mark.parametrize("garbage", [False, True], ids=["cut", "cut-then-garbage"])
def test_a_segment_cut_mid_record_after_sigkill(garbage: bool, launch: Launch, tmp_path: Path) -> None:
    store = tmp_path / "store"
    port = free_port(HOST)
    cl = launch("commitlog", *_args(store), host=HOST, port=port)
    with grpc.insecure_channel(cl.address) as ch:
        stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
        sent = [_send(stub, i) for i in range(100)]  # ~92 KiB: two segments
        # The checkpoint covers every record before the kill: only the disk can say what was lost.
        wait_until(lambda: json.loads((store / "quarry-checkpoint.json").read_text())["flushed_offset"] > sent[-1].physical_offset,
                   what="the checkpoint covering the last record")
    cl.kill()
    last = sent[-1]
    newest = store / "commitlog" / f"{last.physical_offset - last.physical_offset % SEGMENT:020d}"
    cut_at = last.physical_offset % SEGMENT + 300  # in the middle of the last record
    with open(newest, "r+b") as fh:
        fh.truncate(cut_at)
        if garbage:
            fh.seek(cut_at)
            fh.write(os.urandom(SEGMENT - cut_at))

    again = launch("commitlog", *_args(store), host=HOST, port=port)
    with grpc.insecure_channel(again.address) as ch:
        stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
        status = _status(stub)
        assert status.max_offset == last.physical_offset  # the log ends at the last whole record
        assert status.recovered and status.corruption, status
        if not garbage:
            assert any("torn" in c for c in status.corruption)
        assert any("bytes were cut" in c for c in status.corruption), status.corruption
        queue = next(t for t in status.topics if t.topic == TOPIC)
        assert queue.max_queue_offsets[0] == last.queue_offset  # the cut record left the queue too
        after = [_send(stub, 1000 + i) for i in range(60)]  # enough to open a new segment
        assert after[0].physical_offset == last.physical_offset and after[0].queue_offset == last.queue_offset
        pulled: list[int] = []
        offset = 0
        while offset < after[-1].queue_offset + 1:
            got = stub.PullMessages(commitlog_pb2.PullMessagesRequest(topic=TOPIC, queue_id=0, queue_offset=offset, max_count=64), timeout=10)
            pulled += [m.queue_offset for m in got.messages]
            offset = got.next_queue_offset
        assert pulled == list(range(after[-1].queue_offset + 1))  # contiguous: no hole, nothing twice
        keys = [m.keys[0] for m in stub.GetMessages(commitlog_pb2.GetMessagesRequest(physical_offsets=[r.physical_offset for r in sent[:-1] + after]), timeout=10).messages]
        assert keys == [f"k{i}" for i in range(99)] + [f"k{1000 + i}" for i in range(60)]
    files = _segments(store)
    assert len(files) >= 3
    assert all(size == SEGMENT and int(name) % SEGMENT == 0 for name, size in files), files


def test_a_segment_named_off_the_segment_size_stops_the_commitlog(tmp_path: Path) -> None:
    store = tmp_path / "store"
    (store / "commitlog").mkdir(parents=True)
    (store / "commitlog" / f"{1000:020d}").write_bytes(bytes(SEGMENT))
    proc = subprocess.run([sys.executable, "-m", MODULES["commitlog"], "--bind", f"127.0.0.1:{free_port()}", *_args(store)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "refusing to start" in lines[0] and "not a multiple of --segment-size" in lines[0]
    assert _segments(store) == [(f"{1000:020d}", SEGMENT)]  # untouched



def test_a_key_query_that_hits_a_damaged_record_says_so(cluster_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Not `complete` with the damaged one silently missing: the answer is incomplete and its
    notes name the broker and the offset (the other matches are still returned)."""
    from quarry.v1 import router_pb2, router_pb2_grpc

    cluster = cluster_factory(commitlog_args=["--segment-size", str(SEGMENT)])
    cluster.start_router()
    broker = cluster.add_broker("broker-a", "127.0.0.64")
    with grpc.insecure_channel(broker.commitlog.address) as ch:
        stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
        sent = [stub.SendMessage(commitlog_pb2.SendMessageRequest(message=common_pb2.MessageInput(
            topic=TOPIC, body=f"order {i} ".encode() * 50, keys=["dmg-key"], queue_id=0)), timeout=10).result for i in range(5)]
    cluster.wait_indexed()
    assert broker.commitlog.stop() == 0
    bad = sent[2]
    seg_start = bad.physical_offset - bad.physical_offset % SEGMENT
    with open(broker.store_dir / "commitlog" / f"{seg_start:020d}", "r+b") as fh:
        fh.seek(bad.physical_offset - seg_start + 150)
        fh.write(b"\x00\xff\x00")
    broker.commitlog.start()
    assert cluster.router is not None
    with grpc.insecure_channel(cluster.router.address) as ch:
        router = router_pb2_grpc.QueryRouterServiceStub(ch)

        def answered() -> router_pb2.QueryResult | None:
            r = router.QueryMsgByKey(router_pb2.QueryMsgByKeyRequest(topic=TOPIC, key="dmg-key"), timeout=10).result
            return r if all(b.answered for b in r.brokers) else None

        result = wait_until(answered, what="an answer from broker-a after its restart")
    assert not result.complete  # type: ignore[union-attr]
    assert sorted(m.commit_log_offset for m in result.messages) == sorted(r.physical_offset for r in sent if r is not bad)  # type: ignore[union-attr]
    assert any("broker-a" in n and "damaged" in n and str(bad.physical_offset) in n for n in result.notes), result.notes  # type: ignore[union-attr]
