"""The client-lifecycle RPCs every endpoint answers (router and commitlogs alike):
Heartbeat, NotifyClientTermination and the Telemetry stream. Functions over (auth, sessions,
request, metadata), so the router's and the commitlogs' servicers share them.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator, Iterator, Mapping

from quarry.services.log import log_event
from quarry.services.rmq5 import telemetry
from quarry.services.security import Account
from quarry.services.rmq5.auth import CLIENT_ID, Authenticator
from quarry.services.rmq5.contract import Code, service, v2
from quarry.services.rmq5.sessions import Sessions
from quarry.services.commitlog.storage.errors import StoreError
from quarry.services.rmq5.status import RmqError, from_store_error, ok, status_of

log = logging.getLogger("quarry.rmq5")


class _Headers(Mapping[str, str]):
    """A call's text headers, read from gRPC when first looked at: grpc.aio builds them anew on
    every `invocation_metadata()`, and with ACL off most calls never look (the client id aside;
    docs/decisions/per-call-overheads.md)."""

    __slots__ = ("_context", "_read")

    def __init__(self, context: Any) -> None:
        self._context = context
        self._read: dict[str, str] | None = None

    def _headers(self) -> dict[str, str]:
        if self._read is None:
            self._read = {k: v for k, v in (self._context.invocation_metadata() or ()) if isinstance(v, str)}
        return self._read

    def __getitem__(self, name: str) -> str:
        return self._headers()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._headers())

    def __len__(self) -> int:
        return len(self._headers())


def metadata(context: Any) -> Mapping[str, str]:
    return _Headers(context)


def heartbeat(auth: Authenticator, sessions: Sessions, request: service.HeartbeatRequest, md: Mapping[str, str]) -> service.HeartbeatResponse:
    try:
        auth.check(md, "Heartbeat", None)
        client_id = md.get(CLIENT_ID, "")
        if not client_id:
            raise RmqError(Code.CLIENT_ID_REQUIRED, f"{CLIENT_ID}: header required on Heartbeat")
    except RmqError as exc:
        return service.HeartbeatResponse(status=status_of(exc))
    sessions.heartbeat(client_id, request.client_type)
    return service.HeartbeatResponse(status=ok())


def terminate(auth: Authenticator, sessions: Sessions, request: service.NotifyClientTerminationRequest, md: Mapping[str, str], peer: str) -> service.NotifyClientTerminationResponse:
    try:
        auth.check(md, "NotifyClientTermination", None)
    except RmqError as exc:
        return service.NotifyClientTerminationResponse(status=status_of(exc))
    client_id = md.get(CLIENT_ID, "")
    known = sessions.terminate(client_id)
    log_event(log, "client terminated", client_id=client_id or "-", known=known, peer=peer)
    return service.NotifyClientTerminationResponse(status=ok())


def telemetry_refusal(auth: Authenticator, md: Mapping[str, str]) -> service.TelemetryCommand | None:
    """The status a Telemetry stream is refused with (then ended), or None to proceed."""
    try:
        auth.check(md, "Telemetry", None)
    except RmqError as exc:
        return service.TelemetryCommand(status=status_of(exc))
    return None


async def telemetry_stream(auth: Authenticator, sessions: Sessions, policy: telemetry.ServerPolicy, commands: AsyncIterator[service.TelemetryCommand],
                           context: Any, closing: asyncio.Event,
                           outboxes: "dict[asyncio.Queue[service.TelemetryCommand], tuple[str, Account | None]] | None" = None) -> AsyncIterator[service.TelemetryCommand]:
    """One Telemetry stream: refused (then ended) when the caller is not let in, else each
    client command answered until the client closes its side or `closing` is set (the
    server is stopping). A task on the event loop: open streams hold no thread. With
    `outboxes`, the stream's queue of server-initiated commands (a transaction check) is kept
    there, with its client id and the account that opened it, while the stream is open (each
    stream its own: another stream with the same client id takes nothing over); what is put on
    it is written out."""
    md = metadata(context)
    refusal = telemetry_refusal(auth, md)
    if refusal is not None:
        yield refusal
        return
    client_id, peer = md.get(CLIENT_ID, ""), context.peer()
    reader = commands.__aiter__()
    stopping = asyncio.ensure_future(closing.wait())
    outbox: asyncio.Queue[service.TelemetryCommand] = asyncio.Queue()
    if outboxes is not None and client_id:
        outboxes[outbox] = (client_id, auth.caller(md, "Telemetry"))
    nxt: asyncio.Future[service.TelemetryCommand | None] | None = None
    sending = asyncio.ensure_future(outbox.get())
    try:
        while True:
            if nxt is None:
                nxt = asyncio.ensure_future(_next(reader))
            waiting: set[asyncio.Future[Any]] = {nxt, stopping, sending}
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if sending in done:  # a command of the server's own
                yield sending.result()
                sending = asyncio.ensure_future(outbox.get())
                continue
            if nxt not in done:  # the server is stopping
                nxt.cancel()
                return
            command = nxt.result()
            nxt = None
            if command is None:  # the client closed its side
                return
            reply = telemetry.answer(command, client_id, sessions, policy, peer)
            if reply is not None:
                yield reply
    finally:
        stopping.cancel()
        sending.cancel()
        if nxt is not None:
            nxt.cancel()  # (a read of the client's commands left running would outlive the stream)
        if outboxes is not None:
            outboxes.pop(outbox, None)


async def _next(reader: AsyncIterator[service.TelemetryCommand]) -> service.TelemetryCommand | None:
    """The next command, or None at the end (a task must not end in StopAsyncIteration)."""
    try:
        return await reader.__anext__()
    except StopAsyncIteration:
        return None


def in_band(exc: Exception, rpc: str) -> v2.Status:
    """The in-band status of a failed call, for every handler alike: the SDK's own code for a
    refusal, the store's error translated, anything else INTERNAL (logged)."""
    if isinstance(exc, RmqError):
        return status_of(exc)
    if isinstance(exc, StoreError):
        return status_of(from_store_error(exc))
    return internal(exc, rpc)


def internal(exc: Exception, rpc: str) -> v2.Status:
    """An unexpected failure: logged with its trace, answered INTERNAL_SERVER_ERROR."""
    log.exception("rmq5 %s failed", rpc)
    return v2.Status(code=Code.INTERNAL_SERVER_ERROR, message=f"{rpc}: internal error ({type(exc).__name__}: {exc})")
