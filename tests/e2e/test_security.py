"""TLS, mutual TLS and access control on real processes, with a throwaway CA made at run time."""
from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any, Iterator

import grpc
import pytest

from quarry.clients.admin import AdminClient
from quarry.channels import open_channel
from quarry.signing import (
    ACCESS_KEY_HEADER, NONCE_HEADER, SIGNATURE_HEADER, STREAMED, TIMESTAMP_HEADER, request_digest, sign, sign_stream_item,
)
from quarry.clients.producer import Producer
from quarry.v1 import indexer_pb2, router_pb2, router_pb2_grpc
from scripts.launcher import LocalCluster
from tests.e2e.conftest import Launch, launch_with_acl, wait_until
from tests.e2e.pki import make_pki


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, str]:
    return make_pki(tmp_path / "pki", ["127.0.0.1", "127.0.0.31", "127.0.0.32"])


def _list_brokers(address: str) -> list[str]:
    with open_channel(address) as ch:
        return [b.broker_name for b in router_pb2_grpc.QueryRouterServiceStub(ch).ListBrokers(router_pb2.ListBrokersRequest(), timeout=5).brokers]


def test_tls_cluster_works_end_to_end_and_plaintext_is_refused(pki: dict[str, str], cluster_factory, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    env = {"QUARRY_TLS_CERT": pki["server_cert"], "QUARRY_TLS_KEY": pki["server_key"], "QUARRY_TLS_CA": pki["ca"]}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    cluster: LocalCluster = cluster_factory(commitlog_args=["--segment-size", str(1 << 20)], indexer_args=["--hash-slots", "101", "--index-num", "1000"])
    cluster.env = env
    cluster.start_router(host="127.0.0.31")
    cluster.add_broker("broker-a", "127.0.0.32")
    assert cluster.router is not None
    with Producer(cluster.router.address) as p, AdminClient(cluster.router.address) as admin:
        sent = p.send("TlsTopic", b"secret order", keys=["tls-key"])
        assert admin.query_by_id(sent.offset_msg_id).messages[0].body == b"secret order"
        wait_until(lambda: admin.query_by_key("TlsTopic", "tls-key").messages, what="indexed over TLS")
    with grpc.insecure_channel(cluster.router.address) as plain, pytest.raises(grpc.RpcError) as err:
        router_pb2_grpc.QueryRouterServiceStub(plain).ListBrokers(router_pb2.ListBrokersRequest(), timeout=3)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_requires_a_client_certificate(pki: dict[str, str], launch: Launch, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUARRY_TLS_CA", pki["ca"])
    monkeypatch.setenv("QUARRY_TLS_CLIENT_CERT", pki["client_cert"])
    monkeypatch.setenv("QUARRY_TLS_CLIENT_KEY", pki["client_key"])
    for k, v in {"QUARRY_TLS_CERT": pki["server_cert"], "QUARRY_TLS_KEY": pki["server_key"], "QUARRY_TLS_CLIENT_CA": pki["ca"]}.items():
        monkeypatch.setenv(k, v)
    router = launch("router", host="127.0.0.31")
    assert _list_brokers(router.address) == []
    monkeypatch.delenv("QUARRY_TLS_CLIENT_CERT")
    monkeypatch.delenv("QUARRY_TLS_CLIENT_KEY")
    with pytest.raises(grpc.RpcError) as err:
        _list_brokers(router.address)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.fixture
def acl_router(tmp_path: Path, launch: Launch, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    router = launch_with_acl(launch, tmp_path, monkeypatch, [
        {"access_key": "ops", "secret_key": "ops-secret-123", "admin": True},
        {"access_key": "reader", "secret_key": "reader-secret-456", "topics": {"OrderTopic": ["query"]}},
    ], "router")
    yield router.address, router.log_path


def _call(address: str, fn: str, request: object, metadata: list[tuple[str, str]] | None = None) -> grpc.StatusCode:
    with grpc.insecure_channel(address) as ch:
        stub = router_pb2_grpc.QueryRouterServiceStub(ch)
        try:
            getattr(stub, fn)(request, timeout=5, metadata=metadata)
            return grpc.StatusCode.OK
        except grpc.RpcError as exc:
            return exc.code()


def _md(key: str, secret: str, method: str, request: Any, ts: int | None = None, nonce: str | None = None) -> list[tuple[str, str]]:
    """Signed metadata for `request` (None: a streamed request), as SigningInterceptor makes it."""
    ts = ts if ts is not None else int(time.time() * 1000)
    nonce = nonce or secrets.token_hex(8)
    digest = STREAMED if request is None else request_digest(request.SerializeToString())
    return [(ACCESS_KEY_HEADER, key), (TIMESTAMP_HEADER, str(ts)), (NONCE_HEADER, nonce), (SIGNATURE_HEADER, sign(secret, method, ts, key, nonce, digest))]


def _signed_items(secret: str, md: list[tuple[str, str]], items: list[Any]) -> list[Any]:
    """Copies of a streamed call's messages, each signed as SigningInterceptor signs them."""
    call_signature = dict(md)[SIGNATURE_HEADER]
    out = []
    for index, item in enumerate(items):
        signed = type(item)()
        signed.CopyFrom(item)
        signed.signature = sign_stream_item(secret, call_signature, index, item)
        out.append(signed)
    return out


def test_access_control_authenticates_and_authorises_every_call(acl_router: tuple[str, Path]) -> None:
    address, log_path = acl_router
    by_key = "/quarry.v1.QueryRouterService/QueryMsgByKey"
    q = router_pb2.QueryMsgByKeyRequest(topic="OrderTopic", key="k")
    assert _call(address, "QueryMsgByKey", q) == grpc.StatusCode.UNAUTHENTICATED
    assert _call(address, "QueryMsgByKey", q, _md("nobody", "x", by_key, q)) == grpc.StatusCode.UNAUTHENTICATED
    assert _call(address, "QueryMsgByKey", q, _md("reader", "wrong-secret", by_key, q)) == grpc.StatusCode.UNAUTHENTICATED
    assert _call(address, "QueryMsgByKey", q, _md("reader", "reader-secret-456", by_key, q, ts=int(time.time() * 1000) - 600_000)) == grpc.StatusCode.UNAUTHENTICATED
    # Allowed through the ACL: the router then says there is no route (no brokers) — not an ACL error.
    assert _call(address, "QueryMsgByKey", q, _md("reader", "reader-secret-456", by_key, q)) == grpc.StatusCode.NOT_FOUND
    other = router_pb2.QueryMsgByKeyRequest(topic="OtherTopic", key="k")
    assert _call(address, "QueryMsgByKey", other, _md("reader", "reader-secret-456", by_key, other)) == grpc.StatusCode.PERMISSION_DENIED
    reg = router_pb2.RegisterBrokerRequest(broker_name="x", commitlog_addr="127.0.0.1:1", store_host="127.0.0.1:1")
    assert _call(address, "RegisterBroker", reg, _md("reader", "reader-secret-456", "/quarry.v1.QueryRouterService/RegisterBroker", reg)) == grpc.StatusCode.PERMISSION_DENIED
    assert _call(address, "RegisterBroker", reg, _md("ops", "ops-secret-123", "/quarry.v1.QueryRouterService/RegisterBroker", reg)) == grpc.StatusCode.OK
    # A signature for one method does not open another.
    assert _call(address, "RegisterBroker", reg, _md("ops", "ops-secret-123", by_key, reg)) == grpc.StatusCode.UNAUTHENTICATED
    log = log_path.read_text()
    assert "access denied" in log and "reader-secret-456" not in log and "ops-secret-123" not in log


def test_signed_clients_work_through_the_environment(acl_router: tuple[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    address, _ = acl_router
    monkeypatch.setenv("QUARRY_ACCESS_KEY", "ops")
    monkeypatch.setenv("QUARRY_SECRET_KEY", "ops-secret-123")
    with AdminClient(address) as admin:
        assert admin.topics() == []


def test_store_directories_are_private(tmp_path: Path) -> None:
    from quarry.services.commitlog.storage.store import CommitLogStore, StoreConfig

    store = CommitLogStore(StoreConfig(store_dir=tmp_path / "store", segment_size=4096))
    mode = (tmp_path / "store").stat().st_mode & 0o777
    store.close()
    assert mode & 0o077 == 0


def test_access_control_on_the_commitlog_covers_unary_and_streaming_calls(tmp_path: Path, launch: Launch, monkeypatch: pytest.MonkeyPatch) -> None:
    # The commitlog runs on the asyncio server, with its own interceptor: every call shape is checked.
    from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2

    cl = launch_with_acl(launch, tmp_path, monkeypatch, [
        {"access_key": "ops", "secret_key": "ops-secret-123", "admin": True},
        {"access_key": "orders", "secret_key": "orders-secret-789", "topics": {"OrderTopic": ["publish"]}},
    ], "commitlog", "--store-dir", str(tmp_path / "store"))
    svc = "/quarry.v1.CommitLogService/"

    def msg(topic: str) -> common_pb2.MessageInput:
        return common_pb2.MessageInput(topic=topic, body=b"x", queue_id=-1)

    def code(fn: str, request: object, md: list[tuple[str, str]] | None) -> grpc.StatusCode:
        with grpc.insecure_channel(cl.address) as ch:
            stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
            try:
                if fn == "SendStream":
                    stub.SendStream(iter(request), timeout=5, metadata=md)  # type: ignore[call-overload]
                elif fn == "Tail":
                    next(iter(stub.Tail(request, timeout=5, metadata=md)))
                else:
                    getattr(stub, fn)(request, timeout=5, metadata=md)
                return grpc.StatusCode.OK
            except grpc.RpcError as exc:
                return exc.code()

    send = commitlog_pb2.SendMessageRequest(message=msg("OrderTopic"))
    assert code("SendMessage", send, None) == grpc.StatusCode.UNAUTHENTICATED
    assert code("SendMessage", send, _md("orders", "wrong", svc + "SendMessage", send)) == grpc.StatusCode.UNAUTHENTICATED
    assert code("SendMessage", send, _md("orders", "orders-secret-789", svc + "SendMessage", send)) == grpc.StatusCode.OK
    other = commitlog_pb2.SendBatchRequest(messages=[msg("OtherTopic")])
    assert code("SendBatch", other, _md("orders", "orders-secret-789", svc + "SendBatch", other)) == grpc.StatusCode.PERMISSION_DENIED
    stream = [commitlog_pb2.SendStreamRequest(message=msg("OrderTopic")), commitlog_pb2.SendStreamRequest(message=msg("OtherTopic"))]
    assert code("SendStream", stream, None) == grpc.StatusCode.UNAUTHENTICATED
    md = _md("orders", "orders-secret-789", svc + "SendStream", None)
    assert code("SendStream", _signed_items("orders-secret-789", md, stream), md) == grpc.StatusCode.PERMISSION_DENIED
    tail = commitlog_pb2.TailRequest(from_offset=0)
    assert code("Tail", tail, None) == grpc.StatusCode.UNAUTHENTICATED
    assert code("Tail", tail, _md("orders", "orders-secret-789", svc + "Tail", tail)) == grpc.StatusCode.PERMISSION_DENIED
    assert code("Tail", tail, _md("ops", "ops-secret-123", svc + "Tail", tail)) == grpc.StatusCode.OK
    # An unauthenticated caller learns nothing about which methods exist.
    with grpc.insecure_channel(cl.address) as ch:
        with pytest.raises(grpc.RpcError) as err:
            ch.unary_unary(svc + "NoSuchMethod")(b"", timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    log = cl.log_path.read_text()
    assert "access denied" in log and "orders-secret-789" not in log and "ops-secret-123" not in log


def test_a_signature_opens_only_its_own_request_and_only_once(acl_router: tuple[str, Path]) -> None:
    """Router: a replayed call and a call with an altered body are refused
    UNAUTHENTICATED, and the log names the reason without secrets or signatures."""
    address, log_path = acl_router
    by_key = "/quarry.v1.QueryRouterService/QueryMsgByKey"
    signed = router_pb2.QueryMsgByKeyRequest(topic="OrderTopic", key="k")
    md = _md("reader", "reader-secret-456", by_key, signed)
    assert _call(address, "QueryMsgByKey", signed, md) == grpc.StatusCode.NOT_FOUND  # accepted; no broker holds the topic
    assert _call(address, "QueryMsgByKey", signed, md) == grpc.StatusCode.UNAUTHENTICATED  # the same call again
    altered = router_pb2.QueryMsgByKeyRequest(topic="OrderTopic", key="someone-else")
    fresh = _md("reader", "reader-secret-456", by_key, signed)
    assert _call(address, "QueryMsgByKey", altered, fresh) == grpc.StatusCode.UNAUTHENTICATED  # another body, same signature
    assert _call(address, "QueryMsgByKey", signed, fresh) == grpc.StatusCode.NOT_FOUND  # the refusal did not spend it
    log = log_path.read_text()
    assert "replayed signature" in log and "bad signature" in log
    for header in (md, fresh):
        assert dict(header)[SIGNATURE_HEADER] not in log
    assert "reader-secret-456" not in log


def test_signed_sends_cannot_be_replayed_or_altered_on_the_commitlog(tmp_path: Path, launch: Launch, monkeypatch: pytest.MonkeyPatch) -> None:
    """Commitlog (asyncio server): unary and streamed sends, each replayed and altered."""
    from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2

    secret = "orders-secret-789"
    cl = launch_with_acl(launch, tmp_path, monkeypatch, [{"access_key": "orders", "secret_key": secret, "topics": {"OrderTopic": ["publish"]}}],
                         "commitlog", "--store-dir", str(tmp_path / "store"), "--segment-size", "65536")
    svc = "/quarry.v1.CommitLogService/"

    def send(fn: str, request: Any, md: list[tuple[str, str]]) -> tuple[grpc.StatusCode, Any]:
        with grpc.insecure_channel(cl.address) as ch:
            stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
            try:
                if fn == "SendStream":
                    return grpc.StatusCode.OK, stub.SendStream(iter(request), timeout=5, metadata=md)
                return grpc.StatusCode.OK, getattr(stub, fn)(request, timeout=5, metadata=md)
            except grpc.RpcError as exc:
                return exc.code(), None

    def msg(body: bytes) -> common_pb2.MessageInput:
        return common_pb2.MessageInput(topic="OrderTopic", body=body, queue_id=0)

    request = commitlog_pb2.SendMessageRequest(message=msg(b"pay 10"))
    md = _md("orders", secret, svc + "SendMessage", request)
    assert send("SendMessage", request, md)[0] == grpc.StatusCode.OK
    assert send("SendMessage", request, md)[0] == grpc.StatusCode.UNAUTHENTICATED
    md2 = _md("orders", secret, svc + "SendMessage", request)
    assert send("SendMessage", commitlog_pb2.SendMessageRequest(message=msg(b"pay 10000")), md2)[0] == grpc.StatusCode.UNAUTHENTICATED

    items = [commitlog_pb2.SendStreamRequest(message=msg(b"stream %d" % i)) for i in range(3)]
    smd = _md("orders", secret, svc + "SendStream", None)
    signed = _signed_items(secret, smd, items)
    code, resp = send("SendStream", signed, smd)
    assert code == grpc.StatusCode.OK and len(resp.results) == 3
    assert send("SendStream", signed, smd)[0] == grpc.StatusCode.UNAUTHENTICATED  # the whole stream again
    smd2 = _md("orders", secret, svc + "SendStream", None)
    tampered = _signed_items(secret, smd2, items)
    tampered[1].message.body = b"stream altered"  # its signature was made for the original body
    assert send("SendStream", tampered, smd2)[0] == grpc.StatusCode.UNAUTHENTICATED
    smd3 = _md("orders", secret, svc + "SendStream", None)
    swapped = _signed_items(secret, smd3, items)
    swapped[0], swapped[1] = swapped[1], swapped[0]  # each message signed, but in another position
    assert send("SendStream", swapped, smd3)[0] == grpc.StatusCode.UNAUTHENTICATED

    # The signing channel clients use signs streamed calls message by message.
    monkeypatch.setenv("QUARRY_ACCESS_KEY", "orders")
    monkeypatch.setenv("QUARRY_SECRET_KEY", secret)
    with open_channel(cl.address) as ch:
        assert len(commitlog_pb2_grpc.CommitLogServiceStub(ch).SendStream(iter(items), timeout=5).results) == 3
        assert commitlog_pb2_grpc.CommitLogServiceStub(ch).SendMessage(request, timeout=5).result.queue_offset > 0

    # Nothing altered reached the log; the replays added nothing (page cache: visible at once).
    data = b"".join(f.read_bytes() for f in sorted((tmp_path / "store" / "commitlog").iterdir()))
    assert b"pay 10000" not in data and b"stream altered" not in data
    assert data.count(b"pay 10") == 2 and data.count(b"stream 2") == 2
    log = cl.log_path.read_text()
    assert "replayed signature" in log and "bad signature on streamed message 1" in log
    assert secret not in log and dict(md)[SIGNATURE_HEADER] not in log and dict(smd)[SIGNATURE_HEADER] not in log


def test_a_key_presence_watch_is_checked_before_its_indexer_sends_anything(tmp_path: Path, launch: Launch, monkeypatch: pytest.MonkeyPatch) -> None:
    # A watch's signature and its permission (query on "*": it carries every topic's key
    # hashes) are checked before the indexer sends anything.
    ix = launch_with_acl(launch, tmp_path, monkeypatch, [
        {"access_key": "ops", "secret_key": "ops-secret-123", "admin": True},
        {"access_key": "writer", "secret_key": "writer-secret-789", "topics": {"T": ["publish", "query"]}},
    ], "indexer", "--index-dir", str(tmp_path / "ix"), "--commitlog", "127.0.0.1:1", serving_only=False)
    method = "/quarry.v1.IndexerService/WatchKeyPresence"
    request = indexer_pb2.WatchKeyPresenceRequest()

    def watch(key: str, secret: str) -> tuple[list[Any], grpc.StatusCode]:
        got: list[Any] = []
        with grpc.insecure_channel(ix.address) as ch:
            call = ch.unary_stream(method, request_serializer=indexer_pb2.WatchKeyPresenceRequest.SerializeToString,
                                   response_deserializer=indexer_pb2.WatchKeyPresenceResponse.FromString)(request, metadata=_md(key, secret, method, request), timeout=20)
            try:
                for update in call:
                    got.append(update)
                    if update.snapshot_done:
                        call.cancel()
                return got, grpc.StatusCode.OK
            except grpc.RpcError as exc:
                return got, exc.code()

    assert watch("writer", "writer-secret-789") == ([], grpc.StatusCode.PERMISSION_DENIED)  # query on T only, not on "*"
    assert watch("ops", "not-the-secret") == ([], grpc.StatusCode.UNAUTHENTICATED)
    got, code = watch("ops", "ops-secret-123")
    assert code == grpc.StatusCode.CANCELLED and got and got[-1].snapshot_done  # the permitted one gets its snapshot
