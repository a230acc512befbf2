"""The remoting server over real loopback sockets: opaque matching, one-way, codes, bad frames."""
from __future__ import annotations

import asyncio
import logging
import struct

import pytest

from quarry.services.remoting import codes
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
            async with RemotingClient(f"127.0.0.1:{server.port}") as client:  # others are still served
                assert (await client.call(2)).body == b"fast"
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
