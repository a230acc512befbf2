"""A small asyncio remoting client: requests matched to responses by opaque, one-way sends,
optional RocketMQ 4 ACL signing. Used by the tests and the benchmark (Quarry's own clients
speak gRPC)."""
from __future__ import annotations

import asyncio
import itertools
from typing import Any

from quarry.services.remoting import codes
from quarry.services.remoting.acl import sign
from quarry.services.remoting.command import FrameError, RemotingCommand, decode_frame, encode_frame, to_ext_fields


class RemotingClient:
    """One connection to a NameServer or broker."""

    def __init__(self, address: str, access_key: str = "", secret_key: str = "", serialize_type: int = codes.SERIALIZE_JSON,
                 max_frame_bytes: int = 64 * 1024 * 1024) -> None:
        self.address = address
        self.access_key, self.secret_key = access_key, secret_key
        self.serialize_type = serialize_type
        self.max_frame_bytes = max_frame_bytes
        self._opaque = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[RemotingCommand]] = {}
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._read_task: asyncio.Task[None] | None = None
        self.server_requests: asyncio.Queue[RemotingCommand] = asyncio.Queue()  # requests the server sent (a broker's notifications)

    async def connect(self) -> "RemotingClient":
        host, _, port = self.address.rpartition(":")
        self._reader, self._writer = await asyncio.open_connection(host.strip("[]"), int(port))
        self._read_task = asyncio.create_task(self._read_loop())
        return self

    async def __aenter__(self) -> "RemotingClient":
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._read_task is not None:
            self._read_task.cancel()
            try:
                await self._read_task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass

    def request(self, code: int, fields: dict[str, Any] | None = None, body: bytes = b"") -> RemotingCommand:
        return RemotingCommand(code, next(self._opaque), 0, None, to_ext_fields(fields or {}), body, serialize_type=self.serialize_type)

    def _prepare(self, cmd: RemotingCommand) -> bytes:
        if self.access_key:
            sign(cmd, self.access_key, self.secret_key)
        return encode_frame(cmd)

    async def invoke(self, cmd: RemotingCommand, timeout_s: float = 10.0) -> RemotingCommand:
        assert self._writer is not None, "connect() first"
        future: asyncio.Future[RemotingCommand] = asyncio.get_running_loop().create_future()
        self._waiting[cmd.opaque] = future
        try:
            self._writer.write(self._prepare(cmd))
            return await asyncio.wait_for(future, timeout_s)
        finally:
            self._waiting.pop(cmd.opaque, None)

    async def call(self, code: int, fields: dict[str, Any] | None = None, body: bytes = b"", timeout_s: float = 10.0) -> RemotingCommand:
        return await self.invoke(self.request(code, fields, body), timeout_s)

    async def oneway(self, code: int, fields: dict[str, Any] | None = None, body: bytes = b"") -> None:
        assert self._writer is not None, "connect() first"
        cmd = self.request(code, fields, body)
        cmd.flag |= codes.FLAG_ONEWAY
        self._writer.write(self._prepare(cmd))
        await self._writer.drain()

    async def _read_loop(self) -> None:
        assert self._reader is not None
        error: BaseException = ConnectionError(f"{self.address} closed the connection")
        try:
            while True:
                length = int.from_bytes(await self._reader.readexactly(4), "big", signed=True)
                if not 4 <= length <= self.max_frame_bytes:
                    raise FrameError(f"frame length {length} from {self.address}")
                cmd = decode_frame(await self._reader.readexactly(length))
                future = self._waiting.get(cmd.opaque)
                if cmd.is_response and future is not None and not future.done():
                    future.set_result(cmd)
                elif not cmd.is_response:
                    self.server_requests.put_nowait(cmd)
        except (asyncio.IncompleteReadError, ConnectionError, FrameError) as exc:
            error = exc if not isinstance(exc, asyncio.IncompleteReadError) else error
        finally:
            for future in self._waiting.values():
                if not future.done():
                    future.set_exception(error)
