"""The remoting server over real loopback sockets: opaque matching, one-way, codes, bad frames."""
from __future__ import annotations

import asyncio
import logging
import socket
import struct
from typing import Callable, cast

import pytest

from quarry.services.remoting import codes
from quarry.services.remoting import server as server_module
from tests.remoting_client import RemotingClient
from quarry.services.remoting.acl import ACCESS_KEY
from quarry.services.remoting.command import RemotingCommand, decode_frame, encode_frame
from quarry.services.remoting.server import Connection, Limits, RemotingError, RemotingServer, known_key_check, limits_from
from quarry.services.settings import StartupError


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(coro, 30))


class _Handlers:
    def __init__(self) -> None:
        self.release_slow = asyncio.Event()
        self.oneway_seen = asyncio.Event()

    def table(self) -> dict:  # type: ignore[type-arg]
        return {1: self.slow, 2: self.fast, 3: self.oneway, 4: self.refuse, 5: self.crash}

    async def slow(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        await self.release_slow.wait()
        return req.response(body=b"slow")

    async def fast(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        self.release_slow.set()  # the slow request answers only after this one
        return req.response(body=b"fast")

    async def oneway(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        self.oneway_seen.set()
        return req.response(body=b"never sent")

    async def refuse(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        raise RemotingError(codes.TOPIC_NOT_EXIST, "topic[x] not exist")

    async def crash(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        raise KeyError("boom")


async def _others_still_served(server: RemotingServer) -> None:
    """A connection closed for its own fault leaves the server serving the others."""
    async with RemotingClient(f"127.0.0.1:{server.port}") as client:
        assert (await client.call(2)).body == b"fast"


async def _server(handlers: _Handlers, max_frame: int = 1 << 20) -> RemotingServer:
    server = RemotingServer("test", handlers.table(), max_frame)
    await server.start("127.0.0.1:0")
    return server


def test_responses_match_requests_by_opaque_out_of_order() -> None:
    async def main() -> None:
        h = _Handlers()
        server = await _server(h)
        try:
            async with RemotingClient(f"127.0.0.1:{server.port}") as client:
                slow = asyncio.create_task(client.call(1))
                fast = await client.call(2)
                assert fast.body == b"fast" and fast.is_response
                assert (await slow).body == b"slow"
        finally:
            await server.close()
    run(main())


def test_oneway_runs_without_a_response_and_errors_become_codes() -> None:
    async def main() -> None:
        h = _Handlers()
        server = await _server(h)
        try:
            async with RemotingClient(f"127.0.0.1:{server.port}") as client:
                await client.oneway(3)
                await h.oneway_seen.wait()
                refused = await client.call(4)
                assert (refused.code, refused.remark) == (codes.TOPIC_NOT_EXIST, "topic[x] not exist")
                crashed = await client.call(5)
                assert crashed.code == codes.SYSTEM_ERROR and "KeyError" in (crashed.remark or "")
                unknown = await client.call(77)
                assert unknown.code == codes.REQUEST_CODE_NOT_SUPPORTED and "77" in (unknown.remark or "")
        finally:
            await server.close()
    run(main())


@pytest.mark.parametrize("garbage, reason", [
    (struct.pack(">i", 1 << 30), "frame length"),  # larger than the bound: nothing is allocated
    (struct.pack(">i", 2) + b"xx", "frame length 2"),
    (bytes.fromhex("160301011b010001170303"), "a TLS handshake"),  # a ClientHello (RocketMQ 4.9.8 with -Dtls.enable=true)
    (struct.pack(">ii", 6, 2) + b"[]", "expected an object"),
    (struct.pack(">ii", 6, (9 << 24) | 2) + b"{}", "serialization type 9"),
])
def test_malformed_frame_closes_that_connection_with_a_log_line(garbage: bytes, reason: str, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        server = await _server(_Handlers(), max_frame=1 << 20)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(garbage)
            await writer.drain()
            assert await reader.read() == b""  # closed by the server
            writer.close()
            await _others_still_served(server)
        finally:
            await server.close()
    with caplog.at_level(logging.WARNING, logger="quarry.remoting"):
        run(main())
    lines = [(r.getMessage(), str(getattr(r, "kv", {}).get("reason", ""))) for r in caplog.records]
    assert any("malformed frame" in msg and reason in why for msg, why in lines), lines


def test_a_frame_that_never_completes_is_dropped_at_the_frame_timeout(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        server = RemotingServer("test", _Handlers().table(), 1 << 20, limits=Limits(frame_timeout_s=0.2))  # 10 s by default
        await server.start("127.0.0.1:0")
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(struct.pack(">i", 100) + b"only part")  # then nothing more
            await writer.drain()
            assert await reader.read() == b""  # closed by the server
            writer.close()
        finally:
            await server.close()
    with caplog.at_level(logging.WARNING, logger="quarry.remoting"):
        run(main())
    assert any("no complete frame" in str(getattr(r, "kv", {}).get("reason", "")) for r in caplog.records)


def test_a_silent_connection_is_closed_at_the_idle_limit_after_its_requests_were_answered(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        server = RemotingServer("test", _Handlers().table(), 1 << 20, limits=Limits(frame_timeout_s=0.1))
        server.idle_s = 0.3  # 120 s by default
        await server.start("127.0.0.1:0")
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(encode_frame(RemotingCommand(2, 5, 0, None)))
            assert (await _answer(reader)).body == b"fast"  # served, past the frame limit's timer
            assert await reader.read() == b""  # then silent: closed by the server
            writer.close()
        finally:
            await server.close()
    with caplog.at_level(logging.INFO, logger="quarry.remoting"):
        run(main())
    assert [r.getMessage() for r in caplog.records].count("idle connection closed") == 1


# -- what a peer can make the server hold (issue 33, hole 5) -----------------------------------
def _signature_check(cmd: RemotingCommand) -> None:
    """Stands for RemotingAcl (its own tests check signatures): a forged one is refused."""
    if cmd.ext_fields.get("Signature", "forged") == "forged":
        raise RemotingError(codes.NO_PERMISSION, "Signature does not match")


async def _acl_server(handlers: _Handlers, limits: Limits = Limits(), max_frame: int = 1 << 20) -> RemotingServer:
    """A server with ACL on, as the composition roots build it (account "pub")."""
    server = RemotingServer("test", handlers.table(), max_frame, _signature_check, known_key_check(ACCESS_KEY, {"pub"}), limits)
    await server.start("127.0.0.1:0")
    return server


def _frame(access_key: str | None, body_bytes: int, code: int = 2, flag: int = 0) -> tuple[bytes, bytes]:
    """(the frame up to its body, its body) of a request naming `access_key` (None: no key)."""
    fields = {} if access_key is None else {ACCESS_KEY: access_key, "Signature": "forged"}
    frame = encode_frame(RemotingCommand(code, opaque=7, flag=flag, ext_fields=fields, body=b"b" * body_bytes))
    head = len(frame) - body_bytes
    return frame[:head], frame[head:]


async def _open(server: RemotingServer, source: str = "127.0.0.1") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", server.port, local_addr=(source, 0))


async def _answer(reader: asyncio.StreamReader) -> RemotingCommand:
    length = int.from_bytes(await reader.readexactly(4), "big")
    return decode_frame(await reader.readexactly(length))


async def _closed(reader: asyncio.StreamReader) -> bool:
    """The server closed the connection (a reset when it left bytes we sent unread)."""
    try:
        return await reader.read() == b""
    except ConnectionResetError:
        return True


def _refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [str(getattr(r, "kv", {}).get("limit")) for r in caplog.records if r.getMessage() == "remoting connection refused"]


@pytest.mark.parametrize("access_key", ["mallory", None])
def test_with_acl_a_header_naming_no_account_is_refused_before_its_body_is_read(access_key: str | None, caplog: pytest.LogCaptureFixture) -> None:
    """The header of a 1 MiB frame, and not a byte of its body: the server answers NO_PERMISSION
    and closes, so it never waited for (nor buffered) the body; logged once for three tries."""
    async def main() -> None:
        h = _Handlers()
        server = await _acl_server(h, max_frame=2 << 20)
        try:
            for _ in range(3):
                reader, writer = await _open(server)
                head, _body = _frame(access_key, 1 << 20)
                writer.write(head)
                refused = await _answer(reader)
                assert (refused.code, refused.opaque) == (codes.NO_PERMISSION, 7) and ACCESS_KEY in (refused.remark or "")
                assert await _closed(reader)  # closed by the server
                writer.close()
            assert not h.release_slow.is_set()  # the handler never ran
            async with RemotingClient(f"127.0.0.1:{server.port}", "pub", "pub-secret") as client:  # a signed client is served
                assert (await client.call(2)).body == b"fast"
        finally:
            await server.close()
    with caplog.at_level(logging.WARNING, logger="quarry.remoting"):
        run(main())
    assert _refusals(caplog) == ["header"]


def test_with_acl_a_response_frame_needs_no_key() -> None:
    """Clients answer the few requests a broker sends them unsigned (RocketMQ signs requests only)."""
    async def main() -> None:
        server = await _acl_server(_Handlers())
        try:
            reader, writer = await _open(server)
            head, body = _frame(None, 10, flag=codes.FLAG_RESPONSE)
            writer.write(head + body)
            head, body = _frame("mallory", 10)
            writer.write(head + body)
            assert (await _answer(reader)).code == codes.NO_PERMISSION  # the request after it is what is refused
            writer.close()
        finally:
            await server.close()
    run(main())


def test_with_acl_unauthenticated_bytes_are_capped_per_peer_and_in_total(caplog: pytest.LogCaptureFixture) -> None:
    """A known key with a forged signature holds its frame's bytes while the body arrives: a peer
    stalled inside a 600 KiB frame leaves its IP no room for another, and the two IPs together
    (127.0.0.1, 127.0.0.2) no room beyond the total; small frames still pass, and the stalled
    frame, once whole, is answered by the ACL check as before."""
    async def main() -> None:
        limits = Limits(unauthenticated_bytes_per_peer=1 << 20, unauthenticated_bytes=(1 << 20) + (100 << 10))
        server = await _acl_server(_Handlers(), limits)
        try:
            stalled_reader, stalled = await _open(server)
            head, body = _frame("pub", 600 << 10)
            stalled.write(head + body[:-1])
            await stalled.drain()
            for source in ("127.0.0.1", "127.0.0.2"):  # over its IP's share; over the total
                reader, writer = await _open(server, source)
                head2, body2 = _frame("pub", 600 << 10)
                writer.write(head2 + body2)
                assert await _closed(reader)
                writer.close()
            reader, writer = await _open(server, "127.0.0.2")  # 300 KiB fits beside the stalled frame
            head3, body3 = _frame("pub", 300 << 10)
            writer.write(head3 + body3)
            assert (await _answer(reader)).code == codes.NO_PERMISSION  # read whole, then the signature refused
            writer.close()
            stalled.write(body[-1:])
            assert (await _answer(stalled_reader)).code == codes.NO_PERMISSION
            stalled.close()
        finally:
            await server.close()
    with caplog.at_level(logging.WARNING, logger="quarry.remoting"):
        run(main())
    assert sorted(_refusals(caplog)) == ["unauthenticated bytes", "unauthenticated bytes per peer"]


def test_without_acl_frames_are_read_whole_as_before() -> None:
    """ACL off: no byte caps (nothing to authenticate), only the connection cap and frame timeout."""
    async def main() -> None:
        server = RemotingServer("test", _Handlers().table(), 2 << 20, limits=Limits(unauthenticated_bytes_per_peer=1024, unauthenticated_bytes=1024))
        await server.start("127.0.0.1:0")
        try:
            async with RemotingClient(f"127.0.0.1:{server.port}") as a, RemotingClient(f"127.0.0.1:{server.port}") as b:
                answers = await asyncio.gather(a.call(2, body=b"x" * (1 << 20)), b.call(2, body=b"y" * (1 << 20)))
                assert [r.body for r in answers] == [b"fast", b"fast"]
        finally:
            await server.close()
    run(main())


def test_connections_per_peer_are_capped(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        server = RemotingServer("test", _Handlers().table(), limits=Limits(connections_per_peer=2))
        await server.start("127.0.0.1:0")
        try:
            async with RemotingClient(f"127.0.0.1:{server.port}") as a, RemotingClient(f"127.0.0.1:{server.port}") as b:
                for _ in range(3):
                    reader, writer = await _open(server)
                    assert await _closed(reader)  # the third connection of this IP: closed at once
                    writer.close()
                reader, writer = await _open(server, "127.0.0.2")  # another IP has its own count
                head, body = _frame(None, 1)
                writer.write(head + body)
                assert (await _answer(reader)).body == b"fast"
                writer.close()
                assert (await a.call(2)).body == b"fast" and (await b.call(2)).body == b"fast"
            async with RemotingClient(f"127.0.0.1:{server.port}") as c:  # closed ones count no longer
                assert (await c.call(2)).body == b"fast"
        finally:
            await server.close()
    with caplog.at_level(logging.WARNING, logger="quarry.remoting"):
        run(main())
    assert _refusals(caplog) == ["connections per peer"]


def test_byte_caps_below_the_largest_frame_stop_the_start_with_acl_on() -> None:
    import argparse

    args = argparse.Namespace(remoting_connections_per_peer=64, remoting_frame_timeout_ms=10_000, remoting_max_frame_bytes=16 << 20,
                              remoting_unauthenticated_bytes_per_peer=8 << 20, remoting_unauthenticated_bytes=128 << 20)
    assert limits_from(args, acl=False).frame_timeout_s == 10.0  # the caps do not apply
    with pytest.raises(StartupError, match="--remoting-unauthenticated-bytes-per-peer.*--remoting-max-frame-bytes"):
        limits_from(args, acl=True)
    args.remoting_unauthenticated_bytes_per_peer, args.remoting_unauthenticated_bytes = 32 << 20, 16 << 20
    with pytest.raises(StartupError, match="--remoting-unauthenticated-bytes"):
        limits_from(args, acl=True)


class _RecordingWriter:
    def __init__(self) -> None:
        self.writes: list[list[bytes]] = []

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        self.writes.append([data])

    def writelines(self, data: list[bytes]) -> None:
        self.writes.append(list(data))


def test_replies_of_one_loop_turn_leave_in_one_write_in_order_and_a_request_to_the_client_at_once() -> None:
    async def main() -> None:
        writer = _RecordingWriter()
        conn = Connection(("127.0.0.1", 1), writer)  # type: ignore[arg-type]
        replies = [RemotingCommand(2, opaque, 0, None).response(body=b"%d" % opaque) for opaque in (7, 3, 9)]
        for reply in replies:
            conn.reply(reply)
        assert writer.writes == []  # nothing written before the turn ends
        conn.send(RemotingCommand(40, 1, codes.FLAG_ONEWAY, None))
        assert len(writer.writes) == 1  # the server's own request is not held back
        await asyncio.sleep(0)  # (one turn: the flush scheduled by the first reply runs)
        assert [[decode_frame(f[4:]).opaque for f in w] for w in writer.writes[1:]] == [[7, 3, 9]]
        conn.reply(replies[0])
        await asyncio.sleep(0)
        assert len(writer.writes) == 3  # a later turn: a write of its own
    run(main())


def test_pipelined_requests_are_all_answered_in_the_order_their_handlers_finished() -> None:
    async def main() -> None:
        server = await _server(_Handlers())
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"".join(encode_frame(RemotingCommand(2, opaque, 0, None)) for opaque in range(1, 201)))
            answered = []
            for _ in range(200):
                (length,) = struct.unpack(">i", await reader.readexactly(4))
                cmd = decode_frame(await reader.readexactly(length))
                assert cmd.is_response and cmd.body == b"fast"
                answered.append(cmd.opaque)
            assert answered == list(range(1, 201))
            writer.close()
        finally:
            await server.close()
    run(main())


# -- held back: what the server waits for is not held against the client (review of the Protocol server) --
async def _until(condition: Callable[[], bool], what: str, timeout_s: float = 3.0) -> None:
    """Wait for `condition` (polled), failing after `timeout_s`."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not condition():
        if loop.time() > end:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.005)


async def _open_slow_reader(server: RemotingServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A client with a small receive buffer (set before connecting, so the window stays small):
    a large reply it does not read backs up in the server's transport."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", server.port))
    return await asyncio.open_connection(sock=sock)


def _held_back(server: RemotingServer, connections: int = 1) -> bool:
    """The server has `connections` connections and reads none of them (their transports paused)."""
    return len(server._connections) == connections and not any(cast(asyncio.Transport, c.writer).is_reading() for c in server._connections)


def _closed_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.getMessage(), str(getattr(r, "kv", {}).get("reason", ""))) for r in caplog.records if "closed" in r.getMessage()]


def test_a_connection_held_back_by_its_unread_replies_is_not_closed_by_the_frame_or_idle_limit(caplog: pytest.LogCaptureFixture) -> None:
    """Two clients that do not read an 8 MiB reply: the server's writing is held back (the
    transport's pause_writing) and so is its reading. That wait is the server's: one connection
    with a frame begun (its rest sent meanwhile) is not closed at the frame limit, the other
    (between frames) not at the idle limit; once they read, every answer arrives, and the idle
    limit runs again after."""
    big = 8 << 20

    async def large(req: RemotingCommand, conn: Connection) -> RemotingCommand:  # a task's reply: written after the read
        return req.response(body=b"x" * big)

    async def main() -> None:
        server = RemotingServer("test", {1: large, 2: _Handlers().fast}, 1 << 20, limits=Limits(frame_timeout_s=0.3))
        server.idle_s = 0.3
        await server.start("127.0.0.1:0")
        try:
            mid_frame, mid_frame_writer = await _open_slow_reader(server)
            between, between_writer = await _open_slow_reader(server)
            second = encode_frame(RemotingCommand(2, 2, 0, None, body=b"y" * 100))
            mid_frame_writer.write(encode_frame(RemotingCommand(1, 1, 0, None)) + second[:10])  # and a frame begun
            between_writer.write(encode_frame(RemotingCommand(1, 1, 0, None)))
            await _until(lambda: _held_back(server, 2), "both connections held back by their replies")
            mid_frame_writer.write(second[10:])  # the frame's rest: in time, but the server reads no more for now
            await asyncio.sleep(1.0)  # over three times either limit: the time under test, not a wait for an event
            assert len(server._connections) == 2 and not any(c.writer.is_closing() for c in server._connections)  # neither closed
            answers = [await _answer(reader) for reader in (mid_frame, mid_frame, between)]
            assert [(a.opaque, len(a.body)) for a in answers] == [(1, big), (2, 4), (1, big)]
            assert await _closed(mid_frame) and await _closed(between)  # then idle: the limit runs again
            mid_frame_writer.close()
            between_writer.close()
        finally:
            await server.close()
    with caplog.at_level(logging.INFO, logger="quarry.remoting"):
        run(main())
    assert _closed_lines(caplog) == [("idle connection closed", "")] * 2


def test_plain_function_answers_to_pipelined_requests_of_a_client_that_never_reads_stay_bounded() -> None:
    """3000 tiny requests in one write, each answered 100 KiB by a plain function (answered where
    its frame is parsed, no task), from a client that never reads: the answers are written as
    they pile up, so the transport pushes back and the server stops reading with a few in its
    buffer, not one per request of a read (3000 would be ~300 MiB)."""
    def view(req: RemotingCommand, conn: Connection) -> RemotingCommand:
        return req.response(body=b"v" * (100 << 10))

    async def main() -> None:
        server = RemotingServer("test", {33: view}, 1 << 20)
        await server.start("127.0.0.1:0")
        try:
            _reader, writer = await _open_slow_reader(server)
            writer.write(b"".join(encode_frame(RemotingCommand(33, opaque, 0, None, {"offset": "123456789"})) for opaque in range(3000)))
            await _until(lambda: _held_back(server), "the connection held back by its unread answers")
            (conn,) = server._connections
            assert conn.writer.get_write_buffer_size() < 8 << 20
            writer.close()
        finally:
            await server.close()
    run(main())


def test_with_acl_pipelined_frames_each_within_the_per_peer_cap_are_all_answered(caplog: pytest.LogCaptureFixture) -> None:
    """The per-peer cap at the largest frame (as limits_from allows): two 10 KiB frames in one
    write (one loopback segment, so one read) hold 20 KiB together, but each frame is counted on
    its own as it is read, so both are read whole and answered (their forged signatures refused)."""
    async def main() -> None:
        limits = Limits(unauthenticated_bytes_per_peer=16 << 10, unauthenticated_bytes=1 << 20)
        server = await _acl_server(_Handlers(), limits, max_frame=16 << 10)
        try:
            reader, writer = await _open(server)
            head, body = _frame("pub", 10 << 10)
            writer.write((head + body) * 2)
            answers = [await _answer(reader) for _ in range(2)]
            assert [(a.code, a.opaque, a.remark) for a in answers] == [(codes.NO_PERMISSION, 7, "Signature does not match")] * 2
            writer.close()
        finally:
            await server.close()
    with caplog.at_level(logging.WARNING, logger="quarry.remoting"):
        run(main())
    assert _refusals(caplog) == []


def _remark_ending_the_header() -> bytes:
    """A frame whose ROCKETMQ (binary) header ends with its remark: no room for the extFields length."""
    remark = b"rrrr"
    header = struct.pack(">hbhii", 2, 0, 0, 1, 0) + struct.pack(">i", len(remark)) + remark
    return struct.pack(">ii", 4 + len(header), (codes.SERIALIZE_ROCKETMQ << 24) | len(header)) + header


@pytest.mark.parametrize("held_back", [False, True], ids=["arriving", "after MAX_IN_FLIGHT requests"])
@pytest.mark.parametrize("decoder_error", [False, True], ids=["remark ends the header", "decoder raises struct.error"])
def test_a_frame_failing_to_decode_in_any_way_closes_that_connection_with_a_log_line(
        held_back: bool, decoder_error: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A frame that does not decode, read as it arrives or once the connection is no longer held
    back by MAX_IN_FLIGHT slow requests (read from a task's done callback): the connection is closed
    with one "malformed frame" line, nothing escapes to the event loop, and others are served.
    Besides command.py's FrameError, any other error of the decoder (as struct.error was for
    the frame here) is handled so."""
    if decoder_error:
        real_decode = server_module.decode_frame

        def decode(frame: bytes) -> RemotingCommand:
            cmd = real_decode(frame)
            if cmd.code == 99:
                raise struct.error("unpack_from requires a buffer of at least 4 bytes")
            return cmd
        monkeypatch.setattr(server_module, "decode_frame", decode)
        bad, reason = encode_frame(RemotingCommand(99, 1, 0, None)), "error: unpack_from requires a buffer"
    else:
        bad, reason = _remark_ending_the_header(), "extFields length truncated"

    async def main() -> None:
        h = _Handlers()
        server = await _server(h)
        try:
            reader, writer = await _open(server)
            slow = server_module.MAX_IN_FLIGHT if held_back else 0
            writer.write(b"".join(encode_frame(RemotingCommand(1, opaque, 0, None)) for opaque in range(slow)) + bad)
            if held_back:
                await _until(lambda: _held_back(server) and next(iter(server._connections)).in_flight == slow,
                             "the connection held back by its requests in flight")
                h.release_slow.set()
            rest = await asyncio.wait_for(reader.read(), 3)  # until the server closes it
            while rest:  # (after MAX_IN_FLIGHT: the answers flushed as it closed)
                length = int.from_bytes(rest[:4], "big")
                assert decode_frame(rest[4:4 + length]).body == b"slow"
                rest = rest[4 + length:]
            writer.close()
            await _others_still_served(server)
        finally:
            await server.close()
    with caplog.at_level(logging.WARNING, logger="quarry.remoting"):
        run(main())
    closed = _closed_lines(caplog)
    assert len(closed) == 1 and closed[0][0] == "malformed frame; connection closed" and reason in closed[0][1], closed
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


def test_requests_of_one_read_take_effect_in_the_order_they_came() -> None:
    """A handler that answers at once, behind a coroutine handler's request in the same read,
    runs after that coroutine started (a pull's offset commit, then UPDATE_CONSUMER_OFFSET)."""
    effects: list[str] = []

    async def pull_like(req: RemotingCommand, conn: Connection) -> RemotingCommand:
        effects.append(f"coroutine {req.opaque}")  # (its effect before its first wait)
        await asyncio.sleep(0)
        return req.response()

    def update_like(req: RemotingCommand, conn: Connection) -> RemotingCommand:
        effects.append(f"plain {req.opaque}")
        return req.response()

    async def main() -> None:
        server = RemotingServer("test", {10: pull_like, 11: update_like})
        await server.start("127.0.0.1:0")
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"".join(encode_frame(RemotingCommand(code, opaque, 0, None)) for code, opaque in ((11, 1), (10, 2), (11, 3), (10, 4), (11, 5))))
            assert sorted([(await _answer(reader)).opaque for _ in range(5)]) == [1, 2, 3, 4, 5]
            writer.close()
        finally:
            await server.close()
    run(main())
    assert effects == ["plain 1", "coroutine 2", "plain 3", "coroutine 4", "plain 5"]
