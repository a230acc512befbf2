"""The frames carrier (quarry/frames.py, services/frames_server.py, services/query/frames_client.py):
a server announces it on its gRPC port, the router's stubs move their unary calls there, and every
call answers as over gRPC: answers, status codes and details, deadlines, cancellation, a lost
connection, a stopping server."""
from __future__ import annotations

import asyncio
from typing import Any

import grpc

from quarry.services.call_tracking import CallTracker
from quarry.services.errors import NotFound
from quarry.services.frames_server import FramesServer, announced
from quarry.services.metrics import ServiceMetrics
from quarry.services.query.broker_clients import BrokerClients
from quarry.services.serving import Registration, start_aio_server, stop_server
from quarry.services.status import rpc_errors
from quarry.transport import lost_connection
from quarry.v1 import indexer_pb2, indexer_pb2_grpc
from tests.servicers import on_loop

INDEXER = indexer_pb2.DESCRIPTOR.services_by_name["IndexerService"].full_name


@rpc_errors
class _Indexer(indexer_pb2_grpc.IndexerServiceServicer):
    """Answers a key's length; "missing" is NotFound, "boom" an unexpected error, "slow" waits."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.remaining: list[float | None] = []

    async def QueryMessage(self, request: indexer_pb2.QueryMessageRequest, context: Any) -> indexer_pb2.QueryMessageResponse:
        self.remaining.append(context.time_remaining())
        if request.key == "missing":
            raise NotFound(f"no key {request.key}")
        if request.key == "boom":
            raise ValueError("boom")
        if request.key == "big":
            return indexer_pb2.QueryMessageResponse(physical_offsets=list(range(200_000)))
        if request.key == "slow":
            self.started.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        return indexer_pb2.QueryMessageResponse(physical_offsets=[len(request.key)])


async def _serve(frames_on: bool = True) -> tuple[_Indexer, Any, FramesServer | None]:
    servicer = _Indexer()

    def add(s: Any) -> None:
        indexer_pb2_grpc.add_IndexerServiceServicer_to_server(servicer, s)
    tracker = CallTracker(ServiceMetrics("indexer-test"))
    frames = FramesServer([add], tracker, 1 << 20) if frames_on else None
    if frames is not None:
        await frames.start("127.0.0.1", 0)
    running = await start_aio_server("indexer", "127.0.0.1:0", [Registration(announced(add, frames), INDEXER)], tracker=tracker)
    return servicer, running, frames


async def _outcome(call: Any) -> tuple[str, Any]:
    try:
        return "OK", await call
    except grpc.RpcError as exc:
        return exc.code().name, exc.details()  # type: ignore[attr-defined]


async def _framed(clients: BrokerClients, address: str) -> Any:
    stub = clients.indexer(address)
    async with asyncio.timeout(10):
        while clients._carrier(address) is None:
            await asyncio.sleep(0.01)
    return stub


def _q(key: str) -> indexer_pb2.QueryMessageRequest:
    return indexer_pb2.QueryMessageRequest(topic="T", key=key)


def test_answers_and_status_codes_equal_the_grpc_paths() -> None:
    async def go() -> tuple[list[Any], list[Any]]:
        _, running, frames = await _serve()
        plain, framed = BrokerClients(frames=False), BrokerClients()
        try:
            keys = ["abc", "missing", "boom", "big"]
            stub = await _framed(framed, running.address)
            by_grpc = [await _outcome(plain.indexer(running.address).QueryMessage(_q(k), timeout=5)) for k in keys]
            by_frames = [await _outcome(stub.QueryMessage(_q(k), timeout=5)) for k in keys]
            by_frames += list(await asyncio.gather(*(_outcome(stub.QueryMessage(_q("x" * n), timeout=5)) for n in range(1, 50))))
            return by_grpc, by_frames
        finally:
            await plain.close()
            await framed.close()
            await stop_server(running, 0)
            assert frames is not None
            await frames.close()

    by_grpc, by_frames = on_loop(go())
    assert by_frames[:4] == by_grpc
    assert by_grpc[1] == ("NOT_FOUND", "no key missing") and by_grpc[2][0] == "UNKNOWN"
    assert [r[1].physical_offsets[0] for r in by_frames[4:]] == list(range(1, 50))  # multiplexed, each its own answer


def test_deadline_and_cancellation_reach_the_server() -> None:
    async def go() -> tuple[Any, list[float | None], bool, Any]:
        servicer, running, frames = await _serve()
        clients = BrokerClients()
        try:
            stub = await _framed(clients, running.address)
            late = await _outcome(stub.QueryMessage(_q("slow"), timeout=0.2))
            await asyncio.wait_for(servicer.cancelled.wait(), 5)  # the server stopped it at its deadline
            servicer.started.clear()
            servicer.cancelled.clear()
            task = asyncio.ensure_future(stub.QueryMessage(_q("slow"), timeout=20))
            await asyncio.wait_for(servicer.started.wait(), 5)
            task.cancel()  # the router's caller went away
            await asyncio.wait_for(servicer.cancelled.wait(), 5)
            after = await _outcome(stub.QueryMessage(_q("ok"), timeout=5))
            return late, servicer.remaining, servicer.cancelled.is_set(), after
        finally:
            await clients.close()
            await stop_server(running, 0)
            assert frames is not None
            await frames.close()

    late, remaining, cancelled, after = on_loop(go())
    assert late == ("DEADLINE_EXCEEDED", "Deadline Exceeded")
    assert remaining[0] is not None and 0 < remaining[0] <= 0.2
    assert cancelled and after[0] == "OK"


def test_a_stopping_server_fails_calls_in_flight_unavailable_and_the_next_go_by_grpc() -> None:
    async def go() -> tuple[Any, bool, Any, Any]:
        servicer, running, frames = await _serve()
        clients = BrokerClients()
        try:
            stub = await _framed(clients, running.address)
            task = asyncio.ensure_future(_outcome(stub.QueryMessage(_q("slow"), timeout=20)))
            await asyncio.wait_for(servicer.started.wait(), 5)
            assert frames is not None
            await frames.close()
            cut = await task
            error = grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), cut[1])
            await asyncio.sleep(0.05)
            after = await _outcome(stub.QueryMessage(_q("ok"), timeout=5))  # the carrier is gone: gRPC
            return cut, lost_connection(error), after, clients._carrier(running.address)
        finally:
            await clients.close()
            await stop_server(running, 0)

    cut, lost, after, carrier = on_loop(go())
    assert cut[0] == "UNAVAILABLE" and lost  # the fan-out's one retry
    assert after[0] == "OK" and carrier is None


def test_a_server_without_the_carrier_is_called_by_grpc() -> None:
    async def go() -> tuple[Any, Any]:
        _, running, _ = await _serve(frames_on=False)
        clients = BrokerClients()
        try:
            answer = await _outcome(clients.indexer(running.address).QueryMessage(_q("ab"), timeout=5))
            await asyncio.sleep(0.2)
            return answer, clients._carrier(running.address)
        finally:
            await clients.close()
            await stop_server(running, 0)

    answer, carrier = on_loop(go())
    assert answer[0] == "OK" and answer[1].physical_offsets == [2] and carrier is None


def test_no_carrier_with_acl_or_tls_and_the_log_says_why(tmp_path: Any, monkeypatch: Any, caplog: Any) -> None:
    from quarry.services.frames_server import start_frames
    (tmp_path / "acl.json").write_text('{"accounts": [{"access_key": "ops", "secret_key": "s3cret-s3cret", "admin": true}]}')
    monkeypatch.setenv("QUARRY_ACL_FILE", str(tmp_path / "acl.json"))
    tracker = CallTracker(ServiceMetrics("indexer-test"))
    with caplog.at_level("INFO", logger="quarry.frames"):
        assert on_loop(start_frames("indexer", -1, "127.0.0.1:0", [], tracker, 1 << 20)) is None
    [off] = [r for r in caplog.records if r.getMessage() == "frames carrier off"]
    assert "ACL" in off.kv["reason"]  # type: ignore[attr-defined]
    monkeypatch.delenv("QUARRY_ACL_FILE")
    monkeypatch.setenv("QUARRY_TLS_CA", str(tmp_path / "ca.pem"))
    assert not BrokerClients().frames  # a router with TLS (or signing its calls) keeps them on gRPC
