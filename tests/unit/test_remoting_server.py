"""The remoting server over real loopback sockets: opaque matching, one-way, codes, bad frames."""
from __future__ import annotations

import asyncio
import logging
import struct

import pytest

from quarry.services.remoting import codes
from quarry.services.remoting.client import RemotingClient
from quarry.services.remoting.command import RemotingCommand
from quarry.services.remoting.server import Connection, RemotingError, RemotingServer


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


def test_a_frame_that_never_completes_is_dropped_at_the_idle_limit(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        server = await _server(_Handlers())
        server.idle_s = 0.2  # the limit is RocketMQ's 120 s; short here so the test ends quickly
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
