"""MultiplexServicer.carry runs each carried call's first step in the frame reader's step: a
handler that does not wait is answered before the next frame is read, the answers of one
frame's calls leave in one frame, and a handler that waits goes on in a task of its own, with
the call's deadline and its own timeouts bound to that task, never to the carrier's."""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import grpc
import pytest

from quarry.services.call_tracking import CallTracker
from quarry.services.metrics import ServiceMetrics
from quarry.services.multiplex import MAX_CALLS_IN_FLIGHT, MultiplexServicer
from quarry.v1 import indexer_pb2, multiplex_pb2

METHOD = "/quarry.v1.IndexerService/QueryMessage"


class _Handlers:
    """QueryMessage by key: "now" answers at once; "wait" waits until released (or cancelled);
    "own-timeout" enters a 50 ms asyncio.timeout in its first step and waits past it."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.cancelled: list[str] = []

    async def _backend(self) -> None:
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.append("backend")
            raise

    async def query(self, request: indexer_pb2.QueryMessageRequest, context: Any) -> indexer_pb2.QueryMessageResponse:
        try:
            if request.key == "wait":
                await self.release.wait()
            elif request.key == "fan-out":  # waits on a task of its own, as a router's fan-out does
                await asyncio.gather(self._backend())
            elif request.key == "own-timeout":
                async with asyncio.timeout(0.05):
                    await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.append(request.key)
            raise
        return indexer_pb2.QueryMessageResponse(physical_offsets=[len(request.key)])


def _servicer(handlers: _Handlers) -> tuple[MultiplexServicer, ServiceMetrics]:
    metrics = ServiceMetrics("indexer")
    handler = grpc.unary_unary_rpc_method_handler(
        handlers.query, request_deserializer=indexer_pb2.QueryMessageRequest.FromString,
        response_serializer=indexer_pb2.QueryMessageResponse.SerializeToString)
    return MultiplexServicer({METHOD: handler}, CallTracker(metrics), 4 << 20), metrics


def _request(call_id: int, key: str, timeout_ms: int = 0) -> multiplex_pb2.MultiplexedRequest:
    return multiplex_pb2.MultiplexedRequest(id=call_id, method=METHOD, timeout_ms=timeout_ms,
                                            payload=indexer_pb2.QueryMessageRequest(topic="T", key=key).SerializeToString())


class _Carrier:
    """Frames handed to carry one at a time; what it wrote, frame by frame, with how many frames
    it had asked for when each was written."""

    def __init__(self) -> None:
        self.incoming: asyncio.Queue[multiplex_pb2.CallsRequest | None] = asyncio.Queue()
        self.asked = 0
        self.written: list[tuple[int, list[multiplex_pb2.MultiplexedResponse]]] = []
        self.wrote = asyncio.Event()

    async def frames(self) -> AsyncIterator[multiplex_pb2.CallsRequest]:
        while True:
            self.asked += 1
            frame = await self.incoming.get()
            if frame is None:
                return
            yield frame

    def _record(self, responses: list[multiplex_pb2.MultiplexedResponse]) -> None:
        self.written.append((self.asked, [multiplex_pb2.MultiplexedResponse.FromString(r.SerializeToString()) for r in responses]))
        self.wrote.set()

    async def write(self, responses: list[multiplex_pb2.MultiplexedResponse]) -> None:
        self._record(responses)

    def write_now(self, responses: list[multiplex_pb2.MultiplexedResponse]) -> bool:
        self._record(responses)
        return True

    def answers(self) -> dict[int, tuple[str, list[int]]]:
        out = {}
        for _, frame in self.written:
            for r in frame:
                code = grpc.StatusCode.OK if r.code == 0 else next(c for c in grpc.StatusCode if c.value[0] == r.code)
                out[r.id] = (code.name, list(indexer_pb2.QueryMessageResponse.FromString(r.payload).physical_offsets) if r.payload else [])
        return out

    async def wait_for(self, ids: set[int]) -> None:
        async with asyncio.timeout(10):
            while not ids <= set(self.answers()):
                self.wrote.clear()
                await self.wrote.wait()


def _carry(servicer: MultiplexServicer, carrier: _Carrier) -> asyncio.Task[None]:
    return asyncio.ensure_future(servicer.carry(carrier.frames(), carrier.write, "ipv4:127.0.0.1:1", (), 4 << 20, carrier.write_now))


def test_calls_that_do_not_wait_are_answered_in_one_frame_before_the_next_frame_is_read() -> None:
    async def go() -> tuple[list[tuple[int, int]], dict[int, tuple[str, list[int]]], int]:
        servicer, _ = _servicer(_Handlers())
        carrier = _Carrier()
        carrying = _carry(servicer, carrier)
        before = len(asyncio.all_tasks())
        carrier.incoming.put_nowait(multiplex_pb2.CallsRequest(requests=[_request(1, "now"), _request(2, "nowwww", 5000), _request(3, "n")]))
        await carrier.wait_for({1, 2, 3})
        tasks_after = len(asyncio.all_tasks())
        carrier.incoming.put_nowait(None)
        await asyncio.wait_for(carrying, 10)
        return [(asked, len(frame)) for asked, frame in carrier.written], carrier.answers(), tasks_after - before

    frames, answers, new_tasks = asyncio.run(go())
    # One frame of three answers, written while carry was still on the first frame it asked for
    # (the second ask comes only after the whole frame was handled).
    assert frames == [(1, 3)]
    assert answers == {1: ("OK", [3]), 2: ("OK", [6]), 3: ("OK", [1])}
    assert new_tasks == 0  # no task per call, no writer task


def test_a_call_that_waits_goes_on_in_its_own_task_and_the_carrier_reads_on() -> None:
    async def go() -> tuple[dict[int, tuple[str, list[int]]], dict[int, tuple[str, list[int]]]]:
        handlers = _Handlers()
        servicer, _ = _servicer(handlers)
        carrier = _Carrier()
        carrying = _carry(servicer, carrier)
        carrier.incoming.put_nowait(multiplex_pb2.CallsRequest(requests=[_request(1, "wait")]))
        carrier.incoming.put_nowait(multiplex_pb2.CallsRequest(requests=[_request(2, "now")]))
        await carrier.wait_for({2})
        early = carrier.answers()
        handlers.release.set()
        await carrier.wait_for({1})
        carrier.incoming.put_nowait(None)
        await asyncio.wait_for(carrying, 10)
        return early, carrier.answers()

    early, answers = asyncio.run(go())
    assert early == {2: ("OK", [3])}
    assert answers == {1: ("OK", [4]), 2: ("OK", [3])}


def test_a_waiting_call_past_its_deadline_is_cancelled_and_answered_deadline_exceeded_alone() -> None:
    async def go() -> tuple[dict[int, tuple[str, list[int]]], list[str], bool, float]:
        handlers = _Handlers()
        servicer, metrics = _servicer(handlers)
        carrier = _Carrier()
        carrying = _carry(servicer, carrier)
        carrier.incoming.put_nowait(multiplex_pb2.CallsRequest(requests=[_request(1, "wait", timeout_ms=50)]))
        await carrier.wait_for({1})
        carrier.incoming.put_nowait(multiplex_pb2.CallsRequest(requests=[_request(2, "now", timeout_ms=5000)]))
        await carrier.wait_for({2})
        alive = not carrying.done()
        carrier.incoming.put_nowait(None)
        await asyncio.wait_for(carrying, 10)
        exceeded = metrics.registry.get_sample_value(
            "quarry_rpc_requests_total", {"service": "quarry.v1.IndexerService", "method": "QueryMessage", "code": "DEADLINE_EXCEEDED"}) or 0.0
        return carrier.answers(), handlers.cancelled, alive, exceeded

    answers, cancelled, alive, exceeded = asyncio.run(go())
    assert answers == {1: ("DEADLINE_EXCEEDED", []), 2: ("OK", [3])}
    assert cancelled == ["wait"] and alive and exceeded == 1.0


def test_a_timeout_a_handler_enters_in_its_first_step_ends_that_call_not_the_carrier() -> None:
    async def go() -> tuple[dict[int, tuple[str, list[int]]], bool, int]:
        handlers = _Handlers()
        servicer, _ = _servicer(handlers)
        carrier = _Carrier()
        carrying = _carry(servicer, carrier)
        carrier.incoming.put_nowait(multiplex_pb2.CallsRequest(requests=[_request(1, "own-timeout", timeout_ms=5000), _request(2, "wait")]))
        await carrier.wait_for({1})
        # The handler's own timeout fired: a TimeoutError of its own, answered as unary calls
        # answer one (UNKNOWN); the carrier and the other call were not touched.
        alive = not carrying.done()
        handlers.release.set()
        await carrier.wait_for({2})
        carrier.incoming.put_nowait(None)
        await asyncio.wait_for(carrying, 10)
        return carrier.answers(), alive, carrying.cancelling()

    answers, alive, carrier_cancelling = asyncio.run(go())
    assert answers[1][0] == "UNKNOWN" and answers[2] == ("OK", [4])
    assert alive and carrier_cancelling == 0


@pytest.mark.parametrize("same_frame", [False, True])
def test_the_callers_cancel_reaches_a_waiting_call_and_what_it_waits_on(same_frame: bool) -> None:
    """In its own frame, or in the call's own (the caller gave up before the request left):
    then the call's task has not run yet, and what its first step waits on is cancelled too."""
    async def go() -> tuple[list[str], dict[int, tuple[str, list[int]]]]:
        handlers = _Handlers()
        servicer, _ = _servicer(handlers)
        carrier = _Carrier()
        carrying = _carry(servicer, carrier)
        call, cancel = _request(1, "fan-out", timeout_ms=30_000), multiplex_pb2.MultiplexedRequest(id=1, cancel=True)
        for frame in ([call, cancel],) if same_frame else ([call], [cancel]):
            carrier.incoming.put_nowait(multiplex_pb2.CallsRequest(requests=frame))
        async with asyncio.timeout(10):
            while len(handlers.cancelled) < 2:
                await asyncio.sleep(0.01)
        carrier.incoming.put_nowait(None)
        await asyncio.wait_for(carrying, 10)
        return sorted(handlers.cancelled), carrier.answers()

    cancelled, answers = asyncio.run(go())
    assert cancelled == ["backend", "fan-out"] and answers == {}  # a cancelled call is not answered, as before


def test_a_big_frame_of_calls_answered_at_once_is_answered_in_bounded_frames_between_loop_turns() -> None:
    calls = 2 * MAX_CALLS_IN_FLIGHT + 100

    async def go() -> tuple[list[int], int, int]:
        servicer, _ = _servicer(_Handlers())
        carrier = _Carrier()
        carrying = _carry(servicer, carrier)
        turns = 0

        async def count_turns() -> None:
            nonlocal turns
            while True:
                turns += 1
                await asyncio.sleep(0)

        counting = asyncio.ensure_future(count_turns())
        await asyncio.sleep(0)
        before = turns
        carrier.incoming.put_nowait(multiplex_pb2.CallsRequest(requests=[_request(i + 1, "now") for i in range(calls)]))
        await carrier.wait_for(set(range(1, calls + 1)))
        counting.cancel()
        carrier.incoming.put_nowait(None)
        await asyncio.wait_for(carrying, 10)
        return [len(frame) for _, frame in carrier.written], turns - before, len(carrier.answers())

    frames, turns, answered = asyncio.run(go())
    assert answered == calls
    assert frames == [MAX_CALLS_IN_FLIGHT, MAX_CALLS_IN_FLIGHT, 100]
    assert turns >= 3  # the loop ran between the frame's batches
