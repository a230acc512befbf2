"""The commitlog as a real process on loopback: every RPC, bad input, Tail resumption, and a
SIGKILL while a client sends."""
from __future__ import annotations

import threading
from pathlib import Path

import grpc
import pytest

from quarry.clients.batch_results import batch_send_results
from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2
from tests.e2e.conftest import Launch


def _msg(i: int, topic: str = "T", **kw: object) -> common_pb2.MessageInput:
    return common_pb2.MessageInput(topic=topic, body=f"body-{i}".encode(), keys=[f"k{i}", "shared"], tags="TagA", unique_key=f"UK{i:06d}", queue_id=kw.pop("queue_id", -1), **kw)  # type: ignore[arg-type]


@pytest.fixture
def commitlog(launch: Launch, tmp_path: Path):  # type: ignore[no-untyped-def]
    proc = launch("commitlog", "--store-dir", str(tmp_path / "store"), "--segment-size", "4096", "--max-message-size", "2048", host="127.0.0.2")
    with grpc.insecure_channel(proc.address) as ch:
        yield commitlog_pb2_grpc.CommitLogServiceStub(ch), proc


def test_send_view_get_pull_and_status(commitlog) -> None:  # type: ignore[no-untyped-def]
    stub, proc = commitlog
    one = stub.SendMessage(commitlog_pb2.SendMessageRequest(message=_msg(0, queue_id=1)), timeout=5).result
    assert one.status == common_pb2.SEND_STATUS_SEND_OK and one.unique_key == "UK000000" and one.queue_id == 1
    assert one.offset_msg_id.startswith("7F000002")  # the advertised 127.0.0.2
    batch = stub.SendBatch(commitlog_pb2.SendBatchRequest(messages=[_msg(i, queue_id=1) for i in range(1, 40)]), timeout=10).results
    assert [r.queue_offset for r in batch] == list(range(1, 40))
    streamed = stub.SendStream(iter([commitlog_pb2.SendStreamRequest(message=_msg(i, queue_id=2)) for i in range(40, 45)]), timeout=10).results
    assert len(streamed) == 5
    viewed = stub.ViewMessage(commitlog_pb2.ViewMessageRequest(physical_offset=batch[5].physical_offset), timeout=5).message
    assert (viewed.body, viewed.unique_key, list(viewed.keys), viewed.tags, viewed.offset_msg_id) == (b"body-6", "UK000006", ["k6", "shared"], "TagA", batch[5].offset_msg_id)
    assert viewed.store_host.ip == "127.0.0.2" and viewed.body_crc > 0 and viewed.store_size > 0
    got = stub.GetMessages(commitlog_pb2.GetMessagesRequest(physical_offsets=[one.physical_offset, 3, batch[-1].physical_offset]), timeout=5)
    assert [m.unique_key for m in got.messages] == ["UK000000", "UK000039"] and list(got.not_found) == [3]
    pulled = stub.PullMessages(commitlog_pb2.PullMessagesRequest(topic="T", queue_id=1, queue_offset=38, max_count=10), timeout=5)
    assert [m.unique_key for m in pulled.messages] == ["UK000038", "UK000039"] and pulled.next_queue_offset == 40 and pulled.max_queue_offset == 40
    status = stub.GetStoreStatus(commitlog_pb2.GetStoreStatusRequest(), timeout=5)
    assert status.max_offset > streamed[-1].physical_offset and status.min_offset == 0
    assert len(status.segments) > 1 and status.topics[0].topic == "T" and status.topics[0].queue_count == 4
    assert status.flush_mode == commitlog_pb2.FLUSH_MODE_ASYNC and not status.read_only


def test_compact_batch_answer_rebuilds_what_is_stored(commitlog) -> None:  # type: ignore[no-untyped-def]
    """compact_results: columns instead of one SendResult per message; each rebuilt result
    points at the record stored for its message, as a full answer's would."""
    stub, _ = commitlog
    msgs = [_msg(i, queue_id=i % 2) for i in range(30)]
    answer = stub.SendBatch(commitlog_pb2.SendBatchRequest(messages=msgs, compact_results=True), timeout=10)
    assert not answer.results and answer.compact.store_host.ip == "127.0.0.2"
    rebuilt = batch_send_results(answer, msgs)
    stored = stub.GetMessages(commitlog_pb2.GetMessagesRequest(physical_offsets=[r.physical_offset for r in rebuilt]), timeout=5).messages
    assert [(r.offset_msg_id, r.unique_key, r.queue_id, r.queue_offset, r.topic) for r in rebuilt] == \
        [(m.offset_msg_id, m.unique_key, m.queue_id, m.queue_offset, m.topic) for m in stored]
    assert [m.unique_key for m in stored] == [f"UK{i:06d}" for i in range(30)]
    # Without the flag, the answer is as it always was.
    full = stub.SendBatch(commitlog_pb2.SendBatchRequest(messages=msgs[:3]), timeout=10)
    assert len(full.results) == 3 and not full.HasField("compact") and full.results[0].offset_msg_id.startswith("7F000002")


@pytest.mark.parametrize(
    ("call", "code", "needle"),
    [
        (lambda s: s.SendMessage(commitlog_pb2.SendMessageRequest(message=common_pb2.MessageInput(topic="a b", body=b"x", queue_id=-1)), timeout=5), "INVALID_ARGUMENT", "topic"),
        (lambda s: s.SendMessage(commitlog_pb2.SendMessageRequest(message=common_pb2.MessageInput(topic="T" * 128, body=b"x", queue_id=-1)), timeout=5), "INVALID_ARGUMENT", "127 bytes"),
        (lambda s: s.SendMessage(commitlog_pb2.SendMessageRequest(message=common_pb2.MessageInput(topic="T", body=b"", queue_id=-1)), timeout=5), "INVALID_ARGUMENT", "body"),
        (lambda s: s.SendMessage(commitlog_pb2.SendMessageRequest(message=common_pb2.MessageInput(topic="T", body=b"x" * 4000, queue_id=-1)), timeout=5), "INVALID_ARGUMENT", "max message size"),
        (lambda s: s.SendMessage(commitlog_pb2.SendMessageRequest(message=common_pb2.MessageInput(topic="T", body=b"x", queue_id=-1, properties=[common_pb2.Property(name="a", value="b\x01")])), timeout=5), "INVALID_ARGUMENT", "\\x01"),
        (lambda s: s.SendMessage(commitlog_pb2.SendMessageRequest(message=common_pb2.MessageInput(topic="T", body=b"x", queue_id=-1, properties=[common_pb2.Property(name="a", value="v" * 33000)])), timeout=5), "INVALID_ARGUMENT", "32767"),
        (lambda s: s.SendMessage(commitlog_pb2.SendMessageRequest(message=common_pb2.MessageInput(topic="T", body=b"x", queue_id=9)), timeout=5), "INVALID_ARGUMENT", "queue_id"),
        (lambda s: s.SendBatch(commitlog_pb2.SendBatchRequest(messages=[_msg(1, topic="A"), _msg(2, topic="B")]), timeout=5), "INVALID_ARGUMENT", "messages[1].topic"),
        (lambda s: s.SendBatch(commitlog_pb2.SendBatchRequest(), timeout=5), "INVALID_ARGUMENT", "messages"),
        (lambda s: s.ViewMessage(commitlog_pb2.ViewMessageRequest(physical_offset=-1), timeout=5), "INVALID_ARGUMENT", "physical_offset"),
        (lambda s: s.ViewMessage(commitlog_pb2.ViewMessageRequest(physical_offset=5), timeout=5), "NOT_FOUND", "5"),
        (lambda s: s.ViewMessage(commitlog_pb2.ViewMessageRequest(physical_offset=10**9), timeout=5), "NOT_FOUND", "1000000000"),
        (lambda s: s.GetMessages(commitlog_pb2.GetMessagesRequest(physical_offsets=[-4]), timeout=5), "INVALID_ARGUMENT", "physical_offsets[0]"),
        (lambda s: s.PullMessages(commitlog_pb2.PullMessagesRequest(topic="T", queue_id=0, queue_offset=-1, max_count=1), timeout=5), "INVALID_ARGUMENT", "queue_offset"),
        (lambda s: s.PullMessages(commitlog_pb2.PullMessagesRequest(topic="T", queue_id=0, queue_offset=0, max_count=0), timeout=5), "INVALID_ARGUMENT", "max_count"),
        (lambda s: s.PullMessages(commitlog_pb2.PullMessagesRequest(topic="Nope", queue_id=0, queue_offset=0, max_count=1), timeout=5), "NOT_FOUND", "Nope"),
        (lambda s: next(iter(s.Tail(commitlog_pb2.TailRequest(from_offset=-1), timeout=5))), "INVALID_ARGUMENT", "from_offset"),
        (lambda s: next(iter(s.Tail(commitlog_pb2.TailRequest(from_offset=10**9), timeout=5))), "OUT_OF_RANGE", "past the end"),
        (lambda s: next(iter(s.Tail(commitlog_pb2.TailRequest(from_offset=7), timeout=5))), "NOT_FOUND", "7"),
    ],
)
def test_bad_input_gets_a_clear_status_and_stores_nothing(commitlog, call, code: str, needle: str) -> None:  # type: ignore[no-untyped-def]
    stub, _ = commitlog
    stub.SendMessage(commitlog_pb2.SendMessageRequest(message=_msg(0)), timeout=5)
    before = stub.GetStoreStatus(commitlog_pb2.GetStoreStatusRequest(), timeout=5).max_offset
    with pytest.raises(grpc.RpcError) as err:
        call(stub)
    assert err.value.code().name == code, err.value.details()
    assert needle in err.value.details()
    assert stub.GetStoreStatus(commitlog_pb2.GetStoreStatusRequest(), timeout=5).max_offset == before


def test_tail_follows_live_writes_and_resumes_without_gaps_or_repeats(commitlog) -> None:  # type: ignore[no-untyped-def]
    stub, _ = commitlog
    sent = [r.physical_offset for r in stub.SendBatch(commitlog_pb2.SendBatchRequest(messages=[_msg(i) for i in range(30)]), timeout=10).results]
    seen: list[int] = []
    records: list[commitlog_pb2.DispatchRecord] = []
    stream = stub.Tail(commitlog_pb2.TailRequest(from_offset=0, max_batch=7), timeout=30)
    next_offset = 0
    for resp in stream:
        seen += [r.physical_offset for r in resp.records]
        records += resp.records
        next_offset = resp.next_offset
        if len(seen) >= 12:
            break
    stream.cancel()
    # Reconnect from next_offset while new writes arrive: everything once, in order.
    more = [r.physical_offset for r in stub.SendBatch(commitlog_pb2.SendBatchRequest(messages=[_msg(i) for i in range(30, 50)]), timeout=10).results]
    stream = stub.Tail(commitlog_pb2.TailRequest(from_offset=next_offset), timeout=30)
    for resp in stream:
        seen += [r.physical_offset for r in resp.records]
        records += resp.records
        if len(seen) >= 50:
            break
    stream.cancel()
    assert seen == sent + more
    # The 50 records span several 4 KiB segments (blank records between them are skipped), and
    # each carries its dispatch fields: message i has keys "k<i> shared" and unique key UK<i>.
    assert len({offset // 4096 for offset in seen}) > 1
    for i, r in enumerate(records):
        assert (r.topic, r.keys, r.unique_key, r.size > 0, r.store_timestamp > 0) == ("T", f"k{i} shared", f"UK{i:06d}", True, True)


def test_acknowledged_messages_survive_sigkill(launch: Launch, tmp_path: Path) -> None:
    args = ["--store-dir", str(tmp_path / "store"), "--segment-size", "65536", "--flush-interval-ms", "10000"]
    proc = launch("commitlog", *args, host="127.0.0.3")
    acked: list[common_pb2.SendResult] = []
    stop = threading.Event()

    def sender() -> None:
        with grpc.insecure_channel(proc.address) as ch:
            stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
            i = 0
            while not stop.is_set():
                try:
                    acked.append(stub.SendMessage(commitlog_pb2.SendMessageRequest(message=_msg(i)), timeout=2).result)
                except grpc.RpcError:
                    return
                i += 1

    t = threading.Thread(target=sender)
    t.start()
    from tests.e2e.conftest import wait_until

    wait_until(lambda: len(acked) >= 300, what="300 acknowledged sends")
    proc.kill()
    stop.set()
    t.join()
    again = launch("commitlog", *args, host="127.0.0.3", port=int(proc.address.rsplit(":", 1)[1]))
    with grpc.insecure_channel(again.address) as ch:
        stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
        status = stub.GetStoreStatus(commitlog_pb2.GetStoreStatusRequest(), timeout=5)
        assert status.recovered
        for chunk in range(0, len(acked), 500):
            part = acked[chunk:chunk + 500]
            got = stub.GetMessages(commitlog_pb2.GetMessagesRequest(physical_offsets=[r.physical_offset for r in part]), timeout=10)
            assert not got.not_found
            assert [m.unique_key for m in got.messages] == [r.unique_key for r in part]
        per_queue: dict[int, list[int]] = {}
        for r in acked:
            per_queue.setdefault(r.queue_id, []).append(r.queue_offset)
        for offsets in per_queue.values():
            assert offsets == list(range(len(offsets)))
