"""Request signing: the signature covers the method's text whichever channel type hands it over
(grpc.aio gives bytes, the thread-pool channel str), so a service verifying it agrees."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, AsyncIterator

import grpc
import pytest

from quarry.channels import open_aio_channel
from quarry.services.security import Account, AioAclInterceptor
from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc
from quarry.signing import ACCESS_KEY_HEADER, NONCE_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER, SigningInterceptor, sign


@pytest.mark.parametrize("method", ["/quarry.v1.CommitLogService/GetMessages", b"/quarry.v1.CommitLogService/GetMessages"])
def test_the_signature_covers_the_method_text(method: str | bytes) -> None:
    details = SimpleNamespace(method=method, timeout=1.0, metadata=None, credentials=None, wait_for_ready=None, compression=None)
    signed, signature = SigningInterceptor("ak", "sk")._details(details, "digest")  # type: ignore[arg-type]
    md = dict(signed.metadata)
    assert md[ACCESS_KEY_HEADER] == "ak" and md[SIGNATURE_HEADER] == signature
    assert signature == sign("sk", "/quarry.v1.CommitLogService/GetMessages", int(md[TIMESTAMP_HEADER]), "ak", md[NONCE_HEADER], "digest")
    assert signed.method == method  # passed on as the channel gave it


class _Log(commitlog_pb2_grpc.CommitLogServiceServicer):
    async def Tail(self, request: commitlog_pb2.TailRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[commitlog_pb2.TailResponse]:
        yield commitlog_pb2.TailResponse(next_offset=request.from_offset + 1)

    async def GetStoreStatus(self, request: commitlog_pb2.GetStoreStatusRequest, context: grpc.aio.ServicerContext) -> commitlog_pb2.GetStoreStatusResponse:
        return commitlog_pb2.GetStoreStatusResponse(min_offset=7)


async def _calls_through_acl() -> tuple[object, object]:
    """A unary and a server-streaming call over open_aio_channel to a server checking ACL."""
    server = grpc.aio.server(interceptors=[AioAclInterceptor({"ops": Account("ops", "ops-secret", admin=True)})])
    commitlog_pb2_grpc.add_CommitLogServiceServicer_to_server(_Log(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    outcomes: list[object] = []
    try:
        async with open_aio_channel(f"127.0.0.1:{port}") as channel:
            stub = commitlog_pb2_grpc.CommitLogServiceStub(channel)
            for call in (lambda: stub.GetStoreStatus(commitlog_pb2.GetStoreStatusRequest(), timeout=5),
                         lambda: _first(stub.Tail(commitlog_pb2.TailRequest(from_offset=41), timeout=5))):
                try:
                    outcomes.append(await call())
                except grpc.aio.AioRpcError as exc:
                    outcomes.append(exc.code())
    finally:
        await server.stop(None)
    return outcomes[0], outcomes[1]


async def _first(call: Any) -> Any:
    async for item in call:
        return item


def test_asyncio_channels_sign_unary_and_server_streaming_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """The indexer's Tail is a server-streaming call on a grpc.aio channel: with ACL on, it is
    signed as the unary calls are (grpc.aio files an interceptor under one call kind only)."""
    monkeypatch.setenv("QUARRY_ACCESS_KEY", "ops")
    monkeypatch.setenv("QUARRY_SECRET_KEY", "ops-secret")
    status, tail = asyncio.run(_calls_through_acl())
    assert status.min_offset == 7  # type: ignore[attr-defined]
    assert tail.next_offset == 42  # type: ignore[attr-defined]
    monkeypatch.delenv("QUARRY_ACCESS_KEY")
    monkeypatch.delenv("QUARRY_SECRET_KEY")
    assert asyncio.run(_calls_through_acl()) == (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNAUTHENTICATED)
