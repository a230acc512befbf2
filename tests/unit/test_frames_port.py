"""The TCP frames port (quarry/frames.py, services/frames_port.py): a server offers it on the
gRPC stream, a multiplexed channel moves its calls there once connected, and the calls answer
exactly as unary calls do; a port that cannot be reached leaves the calls on the stream; a lost
connection fails only its calls; a connection that breaks the framing is closed alone."""
from __future__ import annotations

import asyncio
import logging
import socket
import struct
from typing import Any

import grpc
import pytest

from quarry.frames import HELLO, MAGIC, TOKEN_BYTES
from quarry.multiplex import MultiplexedChannel, _FramesStream
from quarry.transport import lost_connection
from quarry.services.frames_port import _peer
from quarry.services.serving import Registration, RunningAioServer, start_aio_server, stop_server
from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, indexer_pb2, indexer_pb2_grpc, multiplex_pb2
from tests.servicers import BIND, InProcessBroker, on_loop

INDEXER = indexer_pb2.DESCRIPTOR.services_by_name["IndexerService"].full_name


async def _outcome(call: Any) -> tuple[str, Any]:
    try:
        return "OK", await call
    except grpc.RpcError as exc:
        return exc.code().name, exc.details()  # type: ignore[attr-defined]


async def _until(condition: Any, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


async def _on_frames(mux: MultiplexedChannel, first_call: Any) -> None:
    """Make `first_call` (over the gRPC stream, which tells the frames port), then wait until
    the channel's calls go over the frames connection."""
    assert mux.carrier == "stream"
    assert (await _outcome(first_call()))[0] == "OK"

    def framed() -> bool:
        mux.stream()  # starts the connection once the port is known
        return mux.carrier == "frames"
    await _until(framed)


class _Indexer(indexer_pb2_grpc.IndexerServiceServicer):
    """Answers a key's length; "slow" waits until released."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = asyncio.Event()

    async def QueryMessage(self, request: indexer_pb2.QueryMessageRequest, context: Any) -> indexer_pb2.QueryMessageResponse:
        if request.key == "slow":
            self.started.set()
            await self.release.wait()
        return indexer_pb2.QueryMessageResponse(physical_offsets=[len(request.key)])


async def _indexer(bind: str = BIND, frames_port: int | None = 0) -> tuple[_Indexer, RunningAioServer]:
    servicer = _Indexer()
    running = await start_aio_server("indexer", bind, [Registration(lambda s: indexer_pb2_grpc.add_IndexerServiceServicer_to_server(servicer, s), INDEXER)],
                                     frames_port=frames_port)
    return servicer, running


def _query(key: str) -> indexer_pb2.QueryMessageRequest:
    return indexer_pb2.QueryMessageRequest(topic="T", key=key)


def test_calls_move_to_the_frames_port_and_answer_as_unary_calls_do(broker: InProcessBroker) -> None:
    address = broker.commitlog_addr

    async def go() -> tuple[list[Any], list[Any], common_pb2.StoredMessage, str]:
        mux = MultiplexedChannel(grpc.aio.insecure_channel(address), host="127.0.0.1")
        plain = grpc.aio.insecure_channel(address)
        try:
            framed = commitlog_pb2_grpc.CommitLogServiceStub(mux)  # type: ignore[arg-type]
            unary = commitlog_pb2_grpc.CommitLogServiceStub(plain)
            await _on_frames(mux, lambda: framed.GetStoreStatus(commitlog_pb2.GetStoreStatusRequest(), timeout=10))
            # Sent over frames without a born host: born at the caller's address, as a unary send is.
            sent = await asyncio.gather(*(framed.SendMessage(commitlog_pb2.SendMessageRequest(message=common_pb2.MessageInput(
                topic="FramesTopic", body=f"body-{i}".encode(), keys=[f"k{i}"], queue_id=-1)), timeout=10) for i in range(30)))
            requests = [commitlog_pb2.ViewMessageRequest(physical_offset=s.result.physical_offset) for s in sent]
            requests.append(commitlog_pb2.ViewMessageRequest(physical_offset=1 << 40))
            over_frames = await asyncio.gather(*(_outcome(framed.ViewMessage(r, timeout=10)) for r in requests))
            plain_answers = await asyncio.gather(*(_outcome(unary.ViewMessage(r, timeout=10)) for r in requests))
            return over_frames, plain_answers, over_frames[0][1].message, mux.carrier
        finally:
            await mux.close()
            await plain.close()

    over_frames, plain_answers, first, carrier = on_loop(go())
    assert carrier == "frames"
    assert over_frames == plain_answers
    assert [m.message.body for _, m in over_frames[:30]] == [f"body-{i}".encode() for i in range(30)]
    assert over_frames[30][0] == plain_answers[30][0] != "OK"
    assert first.born_host.ip == "127.0.0.1" and first.born_host.port > 0


def test_no_frames_port_is_offered_when_it_is_off() -> None:
    async def go() -> str:
        _, running = await _indexer(frames_port=None)
        mux = MultiplexedChannel(grpc.aio.insecure_channel(running.address), host="127.0.0.1")
        try:
            stub = indexer_pb2_grpc.IndexerServiceStub(mux)  # type: ignore[arg-type]
            for _ in range(3):
                assert (await _outcome(stub.QueryMessage(_query("abc"), timeout=10)))[0] == "OK"
            mux.stream()
            return mux.carrier
        finally:
            await mux.close()
            await stop_server(running, 0)

    assert on_loop(go()) == "stream"


def test_an_unreachable_frames_port_leaves_the_calls_on_the_stream(caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> tuple[list[str], str]:
        _, running = await _indexer()
        assert running.frames is not None
        running.frames.close()  # offered, but nothing listens there any more
        await running.frames.close_connections()
        mux = MultiplexedChannel(grpc.aio.insecure_channel(running.address), host="127.0.0.1")
        try:
            stub = indexer_pb2_grpc.IndexerServiceStub(mux)  # type: ignore[arg-type]
            codes = [(await _outcome(stub.QueryMessage(_query("abc"), timeout=10)))[0]]

            def tried() -> bool:
                mux.stream()  # starts the connection, which fails
                return mux._frames_retry_at > 0
            await _until(tried)
            codes += [(await _outcome(stub.QueryMessage(_query("abcd"), timeout=10)))[0] for _ in range(3)]
            return codes, mux.carrier
        finally:
            await mux.close()
            await stop_server(running, 0)

    with caplog.at_level(logging.WARNING, logger="quarry.multiplex"):
        codes, carrier = on_loop(go())
    assert codes == ["OK"] * 4 and carrier == "stream"
    assert [r.getMessage() for r in caplog.records if "not reachable" in r.getMessage()][:1]


def test_a_lost_frames_connection_fails_its_calls_and_the_restarted_server_is_found_again() -> None:
    async def go() -> tuple[tuple[str, Any], tuple[str, Any], str]:
        slow, running = await _indexer()
        mux = MultiplexedChannel(grpc.aio.insecure_channel(running.address), host="127.0.0.1")
        again: RunningAioServer | None = None
        try:
            stub = indexer_pb2_grpc.IndexerServiceStub(mux)  # type: ignore[arg-type]
            await _on_frames(mux, lambda: stub.QueryMessage(_query("warm"), timeout=10))
            waiting = asyncio.ensure_future(_outcome(stub.QueryMessage(_query("slow"), timeout=10)))
            await asyncio.wait_for(slow.started.wait(), 10)
            await stop_server(running, 0)  # the broker goes away with the call in flight
            lost = await asyncio.wait_for(waiting, 10)
            # Back on the same gRPC port; its frames port is a new one, learnt on the stream.
            _, again = await _indexer(bind=running.address)
            back = await _outcome(stub.QueryMessage(_query("back"), timeout=10, wait_for_ready=True))
            assert back[0] == "OK"

            async def framed_again() -> bool:
                await _outcome(stub.QueryMessage(_query("x"), timeout=10))
                mux.stream()
                return mux.carrier == "frames"
            async with asyncio.timeout(10):
                while not await framed_again():
                    await asyncio.sleep(0.01)
            after = await _outcome(stub.QueryMessage(_query("backagain"), timeout=10))
            return lost, after, mux.carrier
        finally:
            slow.release.set()
            await mux.close()
            if again is not None:
                await stop_server(again, 0)

    (lost_code, lost_details), (after_code, after), carrier = on_loop(go())
    assert lost_code == "UNAVAILABLE" and "frames connection" in lost_details
    assert after_code == "OK" and list(after.physical_offsets) == [9]
    assert carrier == "frames"


@pytest.mark.parametrize("opening", [
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # not a frames hello
    HELLO.pack(MAGIC, 1 << 20) + struct.pack(">I", 0xFFFFFFF0),  # a frame over the limit
    HELLO.pack(MAGIC, 1 << 20) + struct.pack(">I", 5) + b"\xff\xff\xff\xff\xff",  # a frame that does not parse
])
def test_a_connection_that_breaks_the_framing_is_closed_alone(opening: bytes, caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> tuple[bytes, tuple[str, Any], bytes]:
        _, running = await _indexer()
        assert running.frames is not None
        token = running.frames.token
        mux = MultiplexedChannel(grpc.aio.insecure_channel(running.address), host="127.0.0.1")
        try:
            stub = indexer_pb2_grpc.IndexerServiceStub(mux)  # type: ignore[arg-type]
            await _on_frames(mux, lambda: stub.QueryMessage(_query("warm"), timeout=10))
            reader, writer = await asyncio.open_connection("127.0.0.1", running.frames.port)
            writer.write(opening)
            async with asyncio.timeout(10):
                got = await reader.read()  # until the server closes it
            writer.close()
            still = await _outcome(stub.QueryMessage(_query("still"), timeout=10))
            return got, still, token
        finally:
            await mux.close()
            await stop_server(running, 0)

    with caplog.at_level(logging.WARNING, logger="quarry.frames"):
        got, (code, answer), token = on_loop(go())
    assert got in (b"", MAGIC + token)  # closed, after the hello's answer when the hello was right
    assert code == "OK" and list(answer.physical_offsets) == [5]
    assert len([r for r in caplog.records if r.getMessage() == "frames connection closed"]) == 1


class _Other(_Indexer):
    """Another server's indexer: its answers tell it apart."""

    async def QueryMessage(self, request: indexer_pb2.QueryMessageRequest, context: Any) -> indexer_pb2.QueryMessageResponse:
        return indexer_pb2.QueryMessageResponse(physical_offsets=[1000 + len(request.key)])


def test_a_restarted_server_is_called_even_when_another_server_took_its_old_frames_port() -> None:
    async def go() -> tuple[list[tuple[str, Any]], str]:
        _, running = await _indexer()
        assert running.frames is not None
        old_port = running.frames.port
        mux = MultiplexedChannel(grpc.aio.insecure_channel(running.address), host="127.0.0.1")
        other: RunningAioServer | None = None
        again: RunningAioServer | None = None
        try:
            stub = indexer_pb2_grpc.IndexerServiceStub(mux)  # type: ignore[arg-type]
            await _on_frames(mux, lambda: stub.QueryMessage(_query("warm"), timeout=10))
            await stop_server(running, 0)
            # Another server (of this host) is given the old frames port; the first comes back
            # on its own gRPC port with a new frames port.
            servicer = _Other()
            other = await start_aio_server("other", BIND, [Registration(lambda s: indexer_pb2_grpc.add_IndexerServiceServicer_to_server(servicer, s), INDEXER)],
                                           frames_port=old_port)
            _, again = await _indexer(bind=running.address)
            answers = []
            async with asyncio.timeout(10):
                while len(answers) < 50:
                    answers.append(await _outcome(stub.QueryMessage(_query("abc"), timeout=10)))
                    mux.stream()
                    await asyncio.sleep(0.01)
            return [(code, list(a.physical_offsets) if code == "OK" else a) for code, a in answers], mux.carrier
        finally:
            await mux.close()
            for server in (other, again):
                if server is not None:
                    await stop_server(server, 0)

    answers, carrier = on_loop(go())
    assert answers == [("OK", [3])] * 50
    assert carrier == "frames"


def test_a_server_bound_to_every_ipv6_address_takes_ipv4_callers_on_its_frames_port_too() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")

    async def go() -> tuple[tuple[str, Any], str]:
        # "[::]" is dual-stack for gRPC: the frames port must be so too.
        _, running = await _indexer(bind="[::]:0")
        mux = MultiplexedChannel(grpc.aio.insecure_channel(f"127.0.0.1:{running.port}"), host="127.0.0.1")
        try:
            stub = indexer_pb2_grpc.IndexerServiceStub(mux)  # type: ignore[arg-type]
            await _on_frames(mux, lambda: stub.QueryMessage(_query("warm"), timeout=10))
            return await _outcome(stub.QueryMessage(_query("abcd"), timeout=10)), mux.carrier
        finally:
            await mux.close()
            await stop_server(running, 0)

    (code, answer), carrier = on_loop(go())
    assert code == "OK" and list(answer.physical_offsets) == [4] and carrier == "frames"


@pytest.mark.parametrize("death", ["inside a frame", "reset"])
def test_a_server_dying_on_the_connection_fails_the_calls_as_a_lost_connection_the_fan_out_retries(death: str) -> None:
    """What a broker killed mid-answer leaves on the connection: half a frame, or a reset."""
    token = bytes(range(TOKEN_BYTES))

    async def dying(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(HELLO.size)
        writer.write(MAGIC + token)
        (n,) = struct.unpack(">I", await reader.readexactly(4))
        await reader.readexactly(n)  # the call
        if death == "reset":
            writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:
            writer.write(struct.pack(">I", 100) + b"\x08\x01")  # 2 bytes of 100
            await writer.drain()
        writer.close()

    async def go() -> BaseException:
        server = await asyncio.start_server(dying, "127.0.0.1", 0)
        frames = _FramesStream("127.0.0.1", server.sockets[0].getsockname()[1], token, 4 << 20, lambda exc: None)
        try:
            await _until(lambda: frames.ready or frames.failed is not None)
            assert frames.ready
            _, answer = frames.start("/quarry.v1.IndexerService/QueryMessage", b"", 10)
            with pytest.raises(grpc.RpcError) as lost:
                await asyncio.wait_for(answer, 10)
            return lost.value
        finally:
            frames.close()
            server.close()

    lost = on_loop(go())
    assert lost.code() == grpc.StatusCode.UNAVAILABLE, lost  # type: ignore[attr-defined]
    assert lost_connection(lost)  # as gRPC's own "connection reset" / "socket closed"


def test_a_caller_is_named_as_grpc_names_it() -> None:
    # The born host of a message sent without one: the same over frames as over gRPC, also
    # for an IPv4 caller of the dual-stack socket (an IPv4-mapped address there).
    assert _peer(("127.0.0.1", 5)) == "ipv4:127.0.0.1:5"
    assert _peer(("::ffff:10.1.2.3", 5, 0, 0)) == "ipv4:10.1.2.3:5"
    assert _peer(("::1", 5, 0, 0)) == "ipv6:[::1]:5"
    assert _peer(("2001:db8::ffff:1", 5, 0, 0)) == "ipv6:[2001:db8::ffff:1]:5"


def test_a_server_restarted_on_the_same_fixed_frames_port_is_called_over_frames_again() -> None:
    with socket.socket() as probe:  # a free port, fixed from then on (as compose pins 10913)
        probe.bind(("127.0.0.1", 0))
        fixed = probe.getsockname()[1]

    async def go() -> tuple[list[str], str]:
        _, running = await _indexer(frames_port=fixed)
        mux = MultiplexedChannel(grpc.aio.insecure_channel(running.address), host="127.0.0.1")
        again: RunningAioServer | None = None
        try:
            stub = indexer_pb2_grpc.IndexerServiceStub(mux)  # type: ignore[arg-type]
            await _on_frames(mux, lambda: stub.QueryMessage(_query("warm"), timeout=10))
            await stop_server(running, 0)
            _, again = await _indexer(bind=running.address, frames_port=fixed)
            codes = []

            async def framed_again() -> bool:
                codes.append((await _outcome(stub.QueryMessage(_query("x"), timeout=10)))[0])
                mux.stream()
                return mux.carrier == "frames"
            async with asyncio.timeout(10):  # not FRAMES_RETRY_S: the new start's offer is tried at once
                while not await framed_again():
                    await asyncio.sleep(0.01)
            return codes, mux.carrier
        finally:
            await mux.close()
            if again is not None:
                await stop_server(again, 0)

    codes, carrier = on_loop(go())
    assert carrier == "frames" and codes[-1] == "OK"


class _Big(_Indexer):
    """Answers every query with ~1 MB."""

    async def QueryMessage(self, request: indexer_pb2.QueryMessageRequest, context: Any) -> indexer_pb2.QueryMessageResponse:
        return indexer_pb2.QueryMessageResponse(physical_offsets=range(1 << 40, (1 << 40) + 130_000))


def test_a_caller_that_does_not_read_its_answers_does_not_hold_the_server_stop() -> None:
    async def go() -> None:
        servicer = _Big()
        running = await start_aio_server("indexer", BIND, [Registration(lambda s: indexer_pb2_grpc.add_IndexerServiceServicer_to_server(servicer, s), INDEXER)],
                                         frames_port=0)
        assert running.frames is not None
        reader, writer = await asyncio.open_connection("127.0.0.1", running.frames.port)
        try:
            writer.write(HELLO.pack(MAGIC, 64 << 20))
            await reader.readexactly(len(MAGIC) + TOKEN_BYTES)
            calls = multiplex_pb2.CallsRequest(requests=[multiplex_pb2.MultiplexedRequest(
                id=i, method=f"/{INDEXER}/QueryMessage", payload=_query("k").SerializeToString()) for i in range(1, 60)])
            data = calls.SerializeToString()
            writer.write(struct.pack(">I", len(data)) + data)
            await writer.drain()
            # ~60 MB of answers, none read: the server's socket and its buffer fill up.
            await _until(lambda: any(w.transport.get_write_buffer_size() for w in running.frames._connections))  # type: ignore[union-attr]
            async with asyncio.timeout(10):
                await stop_server(running, 0)
        finally:
            writer.close()

    on_loop(go(), 30)


def test_a_channel_closed_while_its_server_reads_nothing_lets_the_connection_go() -> None:
    token = bytes(TOKEN_BYTES)

    async def deaf(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(HELLO.size)
        writer.write(MAGIC + token)
        await asyncio.Event().wait()  # reads nothing more (a stuck server)

    async def go() -> None:
        server = await asyncio.start_server(deaf, "127.0.0.1", 0)
        frames = _FramesStream("127.0.0.1", server.sockets[0].getsockname()[1], token, 4 << 20, lambda exc: None)
        try:
            await _until(lambda: frames.ready)
            writer = frames._stream_writer
            assert writer is not None
            for _ in range(64):  # 64 MB of calls: the sockets and the channel's buffer fill up
                frames.start(f"/{INDEXER}/QueryMessage", bytes(1 << 20), None)
            await _until(lambda: writer.transport.get_write_buffer_size() > 0)
            frames.close()
            async with asyncio.timeout(10):  # the socket is let go, not kept until the server reads
                await writer.wait_closed()
        finally:
            server.close()

    on_loop(go(), 30)


def test_both_ends_of_a_frames_connection_watch_for_a_peer_gone_without_a_word(broker: InProcessBroker) -> None:
    # A half-open connection (the peer's host vanished) would otherwise hold its calls until
    # TCP gives up, some 15 minutes: keepalive probes and a user timeout end it (quarry/frames.py).
    from quarry.frames import KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_PROBES, USER_TIMEOUT_MS

    address = broker.commitlog_addr
    assert broker.commitlog_server is not None and broker.commitlog_server.frames is not None
    frames = broker.commitlog_server.frames

    def options(writer: asyncio.StreamWriter) -> tuple[int, ...]:
        sock = writer.get_extra_info("socket")
        return (sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),) + tuple(
            sock.getsockopt(socket.IPPROTO_TCP, o) for o in (socket.TCP_KEEPIDLE, socket.TCP_KEEPINTVL, socket.TCP_KEEPCNT, socket.TCP_USER_TIMEOUT))

    async def go() -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
        mux = MultiplexedChannel(grpc.aio.insecure_channel(address), host="127.0.0.1")
        try:
            stub = commitlog_pb2_grpc.CommitLogServiceStub(mux)  # type: ignore[arg-type]
            await _on_frames(mux, lambda: stub.GetStoreStatus(commitlog_pb2.GetStoreStatusRequest(), timeout=10))
            stream = mux.stream()
            assert isinstance(stream, _FramesStream) and stream._stream_writer is not None
            return options(stream._stream_writer), [options(w) for w in frames._connections]
        finally:
            await mux.close()

    client, servers = on_loop(go())
    want = (1, KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_PROBES, USER_TIMEOUT_MS)
    assert client == want
    assert servers and all(s == want for s in servers)


class _Transport:
    def __init__(self, closing: bool = False, buffered: int = 0) -> None:
        self.closing, self.buffered = closing, buffered

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return self.buffered


class _Writer:
    def __init__(self, transport: _Transport) -> None:
        self.transport = transport
        self.written: list[bytes] = []

    def writelines(self, parts: Any) -> None:
        self.written.append(b"".join(parts))


def test_a_frame_is_written_at_once_only_into_an_empty_open_transport() -> None:
    from quarry.frames import write_frame_now

    built: list[int] = []

    def data() -> bytes:
        built.append(1)
        return b"frame"

    for transport in (_Transport(closing=True), _Transport(buffered=1)):
        w = _Writer(transport)
        assert write_frame_now(w, data) is False and w.written == [] and built == []  # type: ignore[arg-type]
    w = _Writer(_Transport())
    assert write_frame_now(w, data) is True  # type: ignore[arg-type]
    assert w.written == [struct.pack(">I", 5) + b"frame"] and built == [1]
