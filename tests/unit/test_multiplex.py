"""MultiplexService: unary calls carried over one stream answer exactly as the unary calls do,
each with its own deadline and status, counted in the server's metrics as unary calls are;
a server without the stream gets plain unary calls; a lost stream is opened again."""
from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Any

import grpc
import pytest

from quarry.multiplex import MultiplexedChannel
from quarry.services.commitlog.flush_signal import FlushSignal
from quarry.services.commitlog.server import CommitLogServicer
from quarry.services.commitlog.store import CommitLogStore, StoreConfig
from quarry.services.multiplex import MAX_CALLS_IN_FLIGHT
from quarry.services.serving import Registration, RunningAioServer, start_aio_server, stop_server
from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, indexer_pb2, indexer_pb2_grpc
from tests.servicers import BIND, InProcessBroker, on_loop

COMMITLOG = commitlog_pb2.DESCRIPTOR.services_by_name["CommitLogService"].full_name
INDEXER = indexer_pb2.DESCRIPTOR.services_by_name["IndexerService"].full_name


def _calls(broker: InProcessBroker, method: str, code: str) -> float:
    """Calls of `method` that ended with `code`, in the commitlog's own metrics."""
    assert broker.commitlog_server is not None and broker.commitlog_server.tracker is not None
    return broker.commitlog_server.tracker.metrics.registry.get_sample_value(
        "quarry_rpc_requests_total", {"service": COMMITLOG, "method": method, "code": code}) or 0.0


def _send(address: str, n: int) -> list[common_pb2.SendResult]:
    async def go() -> list[common_pb2.SendResult]:
        async with grpc.aio.insecure_channel(address) as ch:
            stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
            msgs = [common_pb2.MessageInput(topic="MuxTopic", body=f"body-{i}".encode(), keys=[f"k{i}"], queue_id=-1) for i in range(n)]
            return list((await stub.SendBatch(commitlog_pb2.SendBatchRequest(messages=msgs), timeout=10)).results)
    return on_loop(go())  # type: ignore[no-any-return]


def _wait_for(condition: Any, timeout_s: float = 10.0) -> None:
    async def poll() -> None:
        async with asyncio.timeout(timeout_s):
            while not condition():
                await asyncio.sleep(0.01)
    on_loop(poll())


async def _outcome(call: Any) -> tuple[str, Any]:
    try:
        return "OK", await call
    except grpc.RpcError as exc:
        return exc.code().name, exc.details()  # type: ignore[attr-defined]


def test_carried_calls_answer_as_unary_calls_do_and_are_counted_as_theirs(broker: InProcessBroker) -> None:
    address = broker.commitlog_addr
    sent = _send(address, 40)

    async def go() -> tuple[list[Any], list[Any], bool]:
        mux = MultiplexedChannel(grpc.aio.insecure_channel(address))
        plain = grpc.aio.insecure_channel(address)
        try:
            over_stream = commitlog_pb2_grpc.CommitLogServiceStub(mux)  # type: ignore[arg-type]
            unary = commitlog_pb2_grpc.CommitLogServiceStub(plain)
            # Asked all at once: the calls share frames, each answer goes to its own caller.
            requests = [commitlog_pb2.ViewMessageRequest(physical_offset=r.physical_offset) for r in sent]
            requests += [commitlog_pb2.ViewMessageRequest(physical_offset=1 << 40), commitlog_pb2.PullMessagesRequest(topic="MuxTopic", queue_id=-1)]

            def call(stub: Any, r: Any) -> Any:
                method = stub.ViewMessage if isinstance(r, commitlog_pb2.ViewMessageRequest) else stub.PullMessages
                return _outcome(method(r, timeout=10))
            multiplexed = await asyncio.gather(*(call(over_stream, r) for r in requests))
            plain_answers = await asyncio.gather(*(call(unary, r) for r in requests))
            return multiplexed, plain_answers, mux.multiplexing
        finally:
            await mux.close()
            await plain.close()

    multiplexed, plain_answers, still_multiplexing = on_loop(go())
    assert still_multiplexing
    assert multiplexed == plain_answers
    assert [m.message.body for _, m in multiplexed[:40]] == [f"body-{i}".encode() for i in range(40)]
    assert [code for code, _ in multiplexed[40:]] == [plain_answers[40][0], "INVALID_ARGUMENT"]
    assert plain_answers[40][0] != "OK"
    # Each carried call is counted under its own method and code, as the unary ones are (a
    # unary call is counted when gRPC reports it terminated, which may follow its answer).
    _wait_for(lambda: _calls(broker, "ViewMessage", "OK") >= 80 and _calls(broker, "PullMessages", "INVALID_ARGUMENT") >= 2)
    assert _calls(broker, "ViewMessage", "OK") == 80
    assert _calls(broker, "PullMessages", "INVALID_ARGUMENT") == 2


def test_only_the_quarry_services_unary_methods_are_carried(broker: InProcessBroker) -> None:
    address = broker.commitlog_addr

    async def go() -> list[tuple[str, Any]]:
        mux = MultiplexedChannel(grpc.aio.insecure_channel(address))
        try:
            ident = lambda b: b  # noqa: E731
            health = mux.unary_unary("/grpc.health.v1.Health/Check", request_serializer=ident, response_deserializer=ident)
            absent = mux.unary_unary(f"/{INDEXER}/QueryMessage", request_serializer=ident, response_deserializer=ident)
            return [await _outcome(health(b"", timeout=5)), await _outcome(absent(b"", timeout=5))]
        finally:
            await mux.close()

    (health_code, health_details), (absent_code, _) = on_loop(go())
    assert health_code == "UNIMPLEMENTED" and "not carried" in health_details
    assert absent_code == "UNIMPLEMENTED"


def test_a_server_without_the_stream_gets_plain_unary_calls(tmp_path: Path) -> None:
    store = CommitLogStore(StoreConfig(store_dir=tmp_path / "store", store_host=("127.0.0.1", 10911), segment_size=1 << 20))

    async def go() -> tuple[tuple[str, Any], tuple[str, Any], bool]:
        flushed = FlushSignal(asyncio.get_running_loop())
        server = grpc.aio.server()  # a server of an older Quarry: the commitlog service only
        commitlog_pb2_grpc.add_CommitLogServiceServicer_to_server(CommitLogServicer(store, "broker-a", threading.Event(), flushed), server)
        port = server.add_insecure_port(BIND)
        await server.start()
        mux = MultiplexedChannel(grpc.aio.insecure_channel(f"127.0.0.1:{port}"))
        try:
            stub = commitlog_pb2_grpc.CommitLogServiceStub(mux)  # type: ignore[arg-type]
            first = await asyncio.gather(*(_outcome(stub.GetStoreStatus(commitlog_pb2.GetStoreStatusRequest(), timeout=5)) for _ in range(3)))
            refused = await _outcome(stub.ViewMessage(commitlog_pb2.ViewMessageRequest(physical_offset=1 << 40), timeout=5))
            unary_now = not mux.multiplexing
            # Asked again later (a server upgraded meanwhile): the stream is tried, refused, unary again.
            mux._unary_until = 0.0
            again = await _outcome(stub.GetStoreStatus(commitlog_pb2.GetStoreStatusRequest(), timeout=5))
            return first[0], refused, unary_now and again[0] == "OK" and not mux.multiplexing
        finally:
            await mux.close()
            await server.stop(0)

    try:
        (code, status), (refused_code, _), unary_throughout = on_loop(go())
    finally:
        store.close()
    assert code == "OK" and status.broker_name == "broker-a" and status.max_offset == 0
    assert refused_code != "OK"
    assert unary_throughout


class _SlowIndexer(indexer_pb2_grpc.IndexerServiceServicer):
    """An indexer whose answer depends on the key: "slow" waits until released, "big" is a
    large answer, "timeout" raises the handler's own TimeoutError; any other key answers its
    length at once. It records how many queries ran at once and which were cancelled."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = asyncio.Event()
        self.running = 0
        self.most_running = 0
        self.cancelled = 0

    async def QueryMessage(self, request: indexer_pb2.QueryMessageRequest, context: Any) -> indexer_pb2.QueryMessageResponse:
        self.started.set()
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            if request.key == "slow":
                await self.release.wait()
            if request.key == "big":
                return indexer_pb2.QueryMessageResponse(physical_offsets=range(1 << 40, (1 << 40) + 300_000))
            if request.key == "timeout":
                raise TimeoutError("a socket of the handler's own timed out")
            return indexer_pb2.QueryMessageResponse(physical_offsets=[len(request.key)])
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.running -= 1


async def _slow_indexer(max_message_bytes: int = 128 << 20, carrier: str = "stream") -> tuple[_SlowIndexer, RunningAioServer]:
    slow = _SlowIndexer()
    running = await start_aio_server("indexer", BIND, [Registration(lambda s: indexer_pb2_grpc.add_IndexerServiceServicer_to_server(slow, s), INDEXER)],
                                     max_message_bytes=max_message_bytes, frames_port=0 if carrier == "frames" else None)
    return slow, running


async def _mux(slow: _SlowIndexer, running: RunningAioServer, carrier: str) -> MultiplexedChannel:
    """A multiplexed channel to `running` whose calls go over `carrier`: for "frames", once a
    first call (over the gRPC stream) learnt the frames port and the connection is up."""
    mux = MultiplexedChannel(grpc.aio.insecure_channel(running.address), host="127.0.0.1" if carrier == "frames" else "")
    if carrier == "frames":
        assert (await _outcome(indexer_pb2_grpc.IndexerServiceStub(mux).QueryMessage(_query("warm"), timeout=10)))[0] == "OK"  # type: ignore[arg-type]
        async with asyncio.timeout(10):
            while mux.carrier != "frames":
                mux.stream()  # starts the connection once the port is known
                await asyncio.sleep(0.01)
        slow.started.clear()
        slow.most_running = 0
    assert mux.carrier == carrier
    return mux


@pytest.fixture(params=["stream", "frames"])
def carrier(request: pytest.FixtureRequest) -> str:
    """What the multiplexed calls travel over: the gRPC Calls stream, or the TCP frames port."""
    return request.param  # type: ignore[no-any-return]


def _query(key: str) -> indexer_pb2.QueryMessageRequest:
    return indexer_pb2.QueryMessageRequest(topic="T", key=key)


def test_an_answer_too_large_fails_alone_as_the_unary_call_does(carrier: str) -> None:
    async def go() -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
        slow, running = await _slow_indexer(max_message_bytes=1 << 20, carrier=carrier)  # the answer to "big" is ~1.5 MB
        mux = await _mux(slow, running, carrier)
        plain = grpc.aio.insecure_channel(running.address)
        try:
            keys = ["a", "big", "abc", "timeout"]
            carried = await asyncio.gather(*(_outcome(indexer_pb2_grpc.IndexerServiceStub(mux).QueryMessage(_query(k), timeout=10)) for k in keys))  # type: ignore[arg-type]
            unary = await asyncio.gather(*(_outcome(indexer_pb2_grpc.IndexerServiceStub(plain).QueryMessage(_query(k), timeout=10)) for k in keys))
            return carried, unary
        finally:
            await mux.close()
            await plain.close()
            await stop_server(running, 0)

    carried, unary = on_loop(go())
    assert [c for c, _ in carried] == [c for c, _ in unary] == ["OK", "RESOURCE_EXHAUSTED", "OK", "UNKNOWN"]
    assert [list(a.physical_offsets) for c, a in carried if c == "OK"] == [[1], [3]]
    assert "larger than max" in carried[1][1] and "TimeoutError" in carried[3][1]


def test_a_caller_that_gives_up_cancels_the_call_on_the_server(carrier: str) -> None:
    async def go() -> tuple[str, int, int]:
        slow, running = await _slow_indexer(carrier=carrier)
        mux = await _mux(slow, running, carrier)
        try:
            stub = indexer_pb2_grpc.IndexerServiceStub(mux)  # type: ignore[arg-type]
            # No deadline of its own: only the caller's cancellation can end it.
            call = asyncio.ensure_future(stub.QueryMessage(_query("slow")))
            await asyncio.wait_for(slow.started.wait(), 10)
            call.cancel()
            async with asyncio.timeout(10):
                while slow.cancelled == 0:
                    await asyncio.sleep(0.01)
            code, _ = await _outcome(stub.QueryMessage(_query("after"), timeout=10))
            return code, slow.cancelled, slow.running
        finally:
            slow.release.set()
            await mux.close()
            await stop_server(running, 0)

    code, cancelled, still_running = on_loop(go())
    assert (code, cancelled, still_running) == ("OK", 1, 0)


def test_a_stream_runs_a_bounded_number_of_calls_at_once_and_answers_all(carrier: str) -> None:
    async def go() -> tuple[list[str], int]:
        slow, running = await _slow_indexer(carrier=carrier)
        mux = await _mux(slow, running, carrier)
        try:
            stub = indexer_pb2_grpc.IndexerServiceStub(mux)  # type: ignore[arg-type]
            calls = [asyncio.ensure_future(_outcome(stub.QueryMessage(_query("slow"), timeout=30))) for _ in range(MAX_CALLS_IN_FLIGHT + 88)]
            async with asyncio.timeout(10):
                while slow.running < MAX_CALLS_IN_FLIGHT:
                    await asyncio.sleep(0.01)
            seen = slow.most_running
            slow.release.set()
            return [code for code, _ in await asyncio.gather(*calls)], seen
        finally:
            slow.release.set()
            await mux.close()
            await stop_server(running, 0)

    codes, most = on_loop(go())
    assert most == MAX_CALLS_IN_FLIGHT
    assert codes == ["OK"] * (MAX_CALLS_IN_FLIGHT + 88)


def test_a_stopping_server_finishes_the_calls_it_runs_and_refuses_new_ones(carrier: str) -> None:
    async def go() -> tuple[tuple[str, Any], tuple[str, Any]]:
        slow, running = await _slow_indexer(carrier=carrier)
        mux = await _mux(slow, running, carrier)
        try:
            stub = indexer_pb2_grpc.IndexerServiceStub(mux)  # type: ignore[arg-type]
            in_flight = asyncio.ensure_future(_outcome(stub.QueryMessage(_query("slow"), timeout=30)))
            await asyncio.wait_for(slow.started.wait(), 10)
            stopping = asyncio.ensure_future(stop_server(running, grace_s=20))
            async with asyncio.timeout(10):
                while not (running.multiplexer and running.multiplexer.stopping):
                    await asyncio.sleep(0.01)
            late = await _outcome(stub.QueryMessage(_query("late"), timeout=10))
            slow.release.set()
            finished = await in_flight
            await asyncio.wait_for(stopping, 20)
            return finished, late
        finally:
            slow.release.set()
            await mux.close()

    (finished_code, finished), (late_code, late_details) = on_loop(go())
    assert finished_code == "OK" and list(finished.physical_offsets) == [4]
    assert late_code == "UNAVAILABLE" and late_details.startswith("stream removed")


def test_a_call_past_its_deadline_fails_alone_and_the_stream_goes_on(carrier: str) -> None:
    async def go() -> tuple[tuple[str, Any], tuple[str, Any]]:
        slow, running = await _slow_indexer(carrier=carrier)
        mux = await _mux(slow, running, carrier)
        try:
            stub = indexer_pb2_grpc.IndexerServiceStub(mux)  # type: ignore[arg-type]
            late = await _outcome(stub.QueryMessage(indexer_pb2.QueryMessageRequest(topic="T", key="slow"), timeout=0.2))
            quick = await _outcome(stub.QueryMessage(indexer_pb2.QueryMessageRequest(topic="T", key="quick"), timeout=5))
            return late, quick
        finally:
            slow.release.set()
            await mux.close()
            await stop_server(running, 0)

    (late_code, _), (quick_code, quick) = on_loop(go())
    assert late_code == "DEADLINE_EXCEEDED"
    assert quick_code == "OK" and list(quick.physical_offsets) == [5]


def test_calls_waiting_on_a_lost_stream_fail_and_the_next_call_opens_a_new_one() -> None:
    async def go() -> tuple[tuple[str, Any], tuple[str, Any]]:
        slow, running = await _slow_indexer()
        port = running.port
        mux = MultiplexedChannel(grpc.aio.insecure_channel(f"127.0.0.1:{port}"))
        again: RunningAioServer | None = None
        try:
            stub = indexer_pb2_grpc.IndexerServiceStub(mux)  # type: ignore[arg-type]
            waiting = asyncio.ensure_future(_outcome(stub.QueryMessage(indexer_pb2.QueryMessageRequest(topic="T", key="slow"), timeout=10)))
            await asyncio.wait_for(slow.started.wait(), 10)
            await running.server.stop(0)  # the broker goes away with the call in flight
            lost = await asyncio.wait_for(waiting, 10)
            again = await start_aio_server("indexer", f"127.0.0.1:{port}", [
                Registration(lambda s: indexer_pb2_grpc.add_IndexerServiceServicer_to_server(_SlowIndexer(), s), INDEXER)])
            after = await _outcome(stub.QueryMessage(indexer_pb2.QueryMessageRequest(topic="T", key="back"), timeout=10, wait_for_ready=True))
            after_stream = await _outcome(stub.QueryMessage(indexer_pb2.QueryMessageRequest(topic="T", key="backagain"), timeout=10))
            assert mux.multiplexing
            return lost, after_stream if after[0] == "OK" else after
        finally:
            slow.release.set()
            await mux.close()
            if again is not None:
                await again.server.stop(0)

    (lost_code, _), (after_code, after) = on_loop(go())
    assert lost_code in ("UNAVAILABLE", "CANCELLED")
    assert after_code == "OK" and list(after.physical_offsets) == [9]



def test_a_server_stopped_without_grace_cancels_the_calls_it_runs(carrier: str, caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> tuple[tuple[str, Any], int, int]:
        slow, running = await _slow_indexer(carrier=carrier)
        mux = await _mux(slow, running, carrier)
        try:
            stub = indexer_pb2_grpc.IndexerServiceStub(mux)  # type: ignore[arg-type]
            in_flight = asyncio.ensure_future(_outcome(stub.QueryMessage(_query("slow"))))
            await asyncio.wait_for(slow.started.wait(), 10)
            await stop_server(running, 0)
            # The handler ends with the server (as a gRPC call's does), not when released later.
            async with asyncio.timeout(10):
                while slow.running:
                    await asyncio.sleep(0.01)
            return await asyncio.wait_for(in_flight, 10), slow.cancelled, slow.running
        finally:
            slow.release.set()
            await mux.close()

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        (code, _), cancelled, still_running = on_loop(go())
    assert (code, cancelled, still_running) == ("UNAVAILABLE", 1, 0)
    assert not [r.getMessage() for r in caplog.records if r.name == "asyncio"]  # no connection task ended in error


def test_a_caller_that_closes_its_channel_cancels_its_calls_on_the_server(carrier: str) -> None:
    async def go() -> tuple[int, int]:
        slow, running = await _slow_indexer(carrier=carrier)
        mux = await _mux(slow, running, carrier)
        try:
            stub = indexer_pb2_grpc.IndexerServiceStub(mux)  # type: ignore[arg-type]
            in_flight = asyncio.ensure_future(_outcome(stub.QueryMessage(_query("slow"))))  # no deadline
            await asyncio.wait_for(slow.started.wait(), 10)
            await mux.close()
            async with asyncio.timeout(10):
                while slow.running:
                    await asyncio.sleep(0.01)
            in_flight.cancel()
            return slow.cancelled, slow.running
        finally:
            slow.release.set()
            await stop_server(running, 0)

    assert on_loop(go()) == (1, 0)


def test_a_call_whose_frame_the_broken_stream_never_sent_is_sent_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """gRPC fails a write on a Calls stream that already ended in its core (a server that
    stopped a moment ago) and grpc.aio reports that end as INTERNAL "Internal error from
    Core". The call in that frame never reached the server: it is sent again on a new stream
    and answered. A call sent before the break may have run: it fails UNAVAILABLE, worded as
    a lost connection (the router's fan-out tries it once more), never INTERNAL."""
    from quarry import multiplex
    from quarry.transport import lost_connection

    async def go() -> tuple[tuple[str, Any], tuple[str, Any], bool]:
        slow, running = await _slow_indexer()
        mux = MultiplexedChannel(grpc.aio.insecure_channel(running.address))
        real_write = multiplex._Stream._write
        broken: list[multiplex._Stream] = []

        async def write(stream: multiplex._Stream, requests: list[Any]) -> None:
            if any(indexer_pb2.QueryMessageRequest.FromString(r.payload).key == "doomed" for r in requests) and not broken:
                broken.append(stream)
                raise grpc.aio.AioRpcError(grpc.StatusCode.INTERNAL, grpc.aio.Metadata(), grpc.aio.Metadata(), "Internal error from Core")
            await real_write(stream, requests)

        monkeypatch.setattr(multiplex._Stream, "_write", write)
        try:
            stub = indexer_pb2_grpc.IndexerServiceStub(mux)  # type: ignore[arg-type]
            sent_before = asyncio.ensure_future(_outcome(stub.QueryMessage(_query("slow"), timeout=10)))
            await asyncio.wait_for(slow.started.wait(), 10)
            doomed = await _outcome(stub.QueryMessage(_query("doomed"), timeout=10))
            before = await asyncio.wait_for(sent_before, 10)
            return doomed, before, len(broken) == 1 and mux.stream() is not broken[0]
        finally:
            slow.release.set()
            await mux.close()
            await stop_server(running, 0)

    (doomed_code, doomed), (before_code, before_details), new_stream = on_loop(go())
    assert (doomed_code, list(doomed.physical_offsets)) == ("OK", [6])
    assert new_stream
    assert before_code == "UNAVAILABLE"
    assert lost_connection(multiplex.MultiplexError(grpc.StatusCode.UNAVAILABLE, before_details))


def _frame_writer(now: Any, busy: bool = False) -> tuple[Any, list[list[str]], list[str]]:
    """A FrameWriter over a recording write, with `now` as its write-at-once hook."""
    from quarry.multiplex import FrameWriter

    frames: list[list[str]] = []
    done: list[str] = []

    async def write(items: list[str]) -> None:
        frames.append(list(items))

    return FrameWriter(write, len, lambda exc, failed, dropped: None, lambda: busy, now), frames, done


def test_a_lone_item_is_written_at_once_and_counted_written() -> None:
    async def go() -> tuple[list[list[str]], list[list[str]], list[str]]:
        at_once: list[list[str]] = []
        writer, frames, done = _frame_writer(lambda items: at_once.append(items) or True)
        writer.send("a", lambda: done.append("a"))
        assert at_once == [["a"]] and done == ["a"] and writer.backlog == 0  # before any turn of the loop
        await writer.drained()
        return at_once, frames, done

    at_once, frames, done = on_loop(go())
    assert at_once == [["a"]] and frames == [] and done == ["a"]


def test_an_item_the_socket_cannot_take_at_once_goes_through_the_writer_in_order() -> None:
    async def go() -> tuple[list[str], list[list[str]], list[str], list[list[str]]]:
        attempts: list[str] = []

        def refuse(items: list[str]) -> bool:
            attempts.append(items[0])
            return False  # bytes still buffered: the writer task waits for the socket

        writer, frames, done = _frame_writer(refuse)
        for item in ("a", "b", "c"):
            writer.send(item, lambda item=item: done.append(item))
        await writer.drained()

        def fail(items: list[str]) -> bool:
            raise OSError("socket gone")  # the writer task meets it again and reports it

        failing, failed_frames, _ = _frame_writer(fail)
        failing.send("x")
        await failing.drained()
        return attempts, frames, done, failed_frames

    attempts, frames, done, failed_frames = on_loop(go())
    assert attempts == ["a"]  # a writer task runs: later items queue behind it, in order
    assert [i for f in frames for i in f] == ["a", "b", "c"] and done == ["a", "b", "c"]
    assert failed_frames == [["x"]]


def test_a_busy_writer_gathers_instead_of_writing_at_once() -> None:
    async def go() -> list[list[str]]:
        at_once: list[list[str]] = []
        writer, frames, _ = _frame_writer(lambda items: at_once.append(items) or True, busy=True)
        writer.send("a")
        writer.send("b")
        await writer.drained()
        assert at_once == []
        return frames

    assert on_loop(go()) == [["a", "b"]]


def test_a_lone_call_over_frames_takes_no_writer_task_on_either_side_and_a_big_answer_does(carrier: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The write-at-once path wired on both ends of a frames connection (the client's
    carrier and the frames port), and only there: the gRPC Calls stream writes through its
    writer tasks, and an answer past WRITE_NOW_BYTES is written by a task, which waits for
    the socket."""
    from quarry import multiplex

    tasks: list[int] = []
    real_run = multiplex.FrameWriter._run

    async def counted(self: Any) -> None:
        tasks.append(1)
        await real_run(self)

    async def go() -> tuple[tuple[str, Any], int, tuple[str, Any], int]:
        slow, running = await _slow_indexer(carrier=carrier)
        mux = await _mux(slow, running, carrier)
        monkeypatch.setattr(multiplex.FrameWriter, "_run", counted)
        try:
            stub = indexer_pb2_grpc.IndexerServiceStub(mux)  # type: ignore[arg-type]
            lone = await _outcome(stub.QueryMessage(_query("abc"), timeout=10))
            lone_tasks = len(tasks)
            big = await _outcome(stub.QueryMessage(_query("big"), timeout=10))
            return lone, lone_tasks, big, len(tasks) - lone_tasks
        finally:
            await mux.close()
            await stop_server(running, 0)

    (code, answer), lone_tasks, (big_code, big_answer), big_tasks = on_loop(go())
    assert code == "OK" and list(answer.physical_offsets) == [3]
    assert big_code == "OK" and len(big_answer.physical_offsets) == 300_000
    if carrier == "frames":
        assert lone_tasks == 0 and big_tasks == 1  # the big answer's writer (its request went at once)
    else:
        assert lone_tasks == 2 and big_tasks == 2  # each side's writer, for each call
