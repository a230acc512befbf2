"""The official RocketMQ 5 Python SDK (PyPI rocketmq-python-client, pinned) sends into a real
Quarry cluster (router + two brokers on loopback), and every message it sent is found again
through the router by the id the SDK returned, by its keys and by its queue offset."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Iterator

import grpc
import pytest
from rocketmq import Credentials, Message, Producer, TransactionChecker, TransactionResolution
from rocketmq.v5.exception import ForbiddenException

from quarry.clients import cli
from quarry.clients.admin import AdminClient
from quarry.clients.errors import NotFoundError
from quarry.formats.record import SYSFLAG_TRANSACTION_COMMIT
from scripts.launcher import LocalCluster
from quarry.services.rmq5.contract import Code, service, service_grpc, v2
from quarry.services.commitlog.broker.transactions import HALF_TOPIC
from tests.e2e.conftest import wait_until
from tests.e2e.rmq5_sdk import acl_cluster, client_config, found_everywhere, tls_cluster

LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(root=tmp_path_factory.mktemp("rmq5"), commitlog_args=["--segment-size", str(4 << 20), "--max-message-size", str(LIMIT)],
                     indexer_args=["--hash-slots", "1001", "--index-num", "10000"])
    with c.running({"broker-a": "127.0.0.52", "broker-b": "127.0.0.53"}, "--max-message-size", str(LIMIT), router_host="127.0.0.51"):
        yield c


def _producer(cluster: LocalCluster, topics: tuple[str, ...], credentials: Credentials | None = None, checker: TransactionChecker | None = None) -> Producer:
    p = Producer(client_config(cluster, credentials), topics, checker)
    p.startup()
    return p


def _message(topic: str, body: bytes, tag: str = "", keys: tuple[str, ...] = (), props: dict[str, str] | None = None) -> Message:
    m = Message()
    m.topic, m.body = topic, body
    if tag:
        m.tag = tag
    for k in keys:
        m.keys = k
    for name, value in (props or {}).items():
        m.add_property(name, value)
    return m


def test_sync_and_async_sends_keep_tag_keys_and_properties(cluster: LocalCluster, admin: AdminClient, capsys: pytest.CaptureFixture[str]) -> None:
    p = _producer(cluster, ("SdkOrders",))
    try:
        sync = p.send(_message("SdkOrders", b"order 1001 paid", "paid", ("order-1001", "cust-7"), {"region": "eu", "amount": "42"}))
        futures = [p.send_async(_message("SdkOrders", f"async {i}".encode(), "async", (f"async-{i}",))) for i in range(8)]
        receipts = [f.result(timeout=15) for f in futures]
    finally:
        p.shutdown()
    m = found_everywhere(admin, "SdkOrders", sync.message_id, sync.offset, ("order-1001", "cust-7"))
    assert (m.body, m.tags, sorted(m.keys)) == (b"order 1001 paid", "paid", ["cust-7", "order-1001"])
    props = dict(m.property_pairs)
    assert props["region"] == "eu" and props["amount"] == "42" and props["UNIQ_KEY"] == sync.message_id
    assert props["__BORNHOST"] and abs(int(props["BORN_TIMESTAMP"]) - m.born_timestamp) < 1000 and m.born_host.startswith("127.0.0.1:")
    assert len({r.message_id for r in receipts}) == 8
    for i, r in enumerate(receipts):
        assert found_everywhere(admin, "SdkOrders", r.message_id, r.offset, (f"async-{i}",)).body == f"async {i}".encode()
    # the mqadmin-style CLI finds the SDK's id with -t (it is a unique key, not an offsetMsgId)
    assert cluster.router is not None
    assert cli.main(["-n", cluster.router.address, "--json", "queryMsgById", "-t", "SdkOrders", "-i", sync.message_id]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["messages"][0]["uniqueKey"] == sync.message_id and out["messages"][0]["tags"] == "paid"  # protobuf JSON names


def test_fifo_group_and_delayed_message(cluster: LocalCluster, admin: AdminClient) -> None:
    p = _producer(cluster, ("SdkFifo", "SdkDelay"))
    try:
        fifo = []
        for i in range(3):
            m = _message("SdkFifo", f"step {i}".encode(), keys=(f"fifo-{i}",))
            m.message_group = "order-77"
            fifo.append(p.send(m))
        deliver_s = int(time.time()) + 3600
        d = _message("SdkDelay", b"remind me in an hour", keys=("delay-1",))
        d.delivery_timestamp = deliver_s
        delayed = p.send(d)
    finally:
        p.shutdown()
    stored = [found_everywhere(admin, "SdkFifo", r.message_id, r.offset, (f"fifo-{i}",)) for i, r in enumerate(fifo)]
    assert len({(m.broker_name, m.queue_id) for m in stored}) == 1  # one group, one queue, in order
    assert [m.queue_offset for m in stored] == sorted(m.queue_offset for m in stored)
    assert all(dict(m.property_pairs)["__SHARDINGKEY"] == "order-77" for m in stored)
    # findable under its real topic an hour before it is due
    m = found_everywhere(admin, "SdkDelay", delayed.message_id, delayed.offset, ("delay-1",))
    assert m.topic == "SdkDelay" and dict(m.property_pairs)["TIMER_DELIVER_MS"] == str(deliver_s * 1000)


class _Commit(TransactionChecker):
    def check(self, message: Message) -> TransactionResolution:
        return TransactionResolution.COMMIT


def test_transaction_commit_is_visible_and_rollback_is_not(cluster: LocalCluster, admin: AdminClient) -> None:
    p = _producer(cluster, ("SdkTx",), checker=_Commit())
    try:
        tx = p.begin_transaction()
        half = p.send(_message("SdkTx", b"debit 10", "tx", ("tx-commit",)), tx)
        assert half.transaction_id
        # stored and indexed as a half, yet not a message of SdkTx until committed
        wait_until(lambda: admin.query_by_unique_key(HALF_TOPIC, half.message_id).messages, what="half indexed")
        with pytest.raises(NotFoundError):
            admin.query_by_unique_key("SdkTx", half.message_id)
        tx.commit()
        tx2 = p.begin_transaction()
        rolled = p.send(_message("SdkTx", b"debit 20", "tx", ("tx-rollback",)), tx2)
        tx2.rollback()
    finally:
        p.shutdown()
    committed = wait_until(lambda: admin.query_by_unique_key("SdkTx", half.message_id).messages, what="commit indexed")[0]  # type: ignore[index]
    assert committed.sys_flag & 0xC == SYSFLAG_TRANSACTION_COMMIT and committed.body == b"debit 10"
    found_everywhere(admin, "SdkTx", half.message_id, committed.queue_offset, ("tx-commit",))
    cluster.wait_indexed()
    with pytest.raises(NotFoundError):
        admin.query_by_unique_key("SdkTx", rolled.message_id)
    try:
        assert admin.query_by_key("SdkTx", "tx-rollback").messages == []
    except NotFoundError:
        pass


def test_body_over_the_limit_is_refused_with_the_limit_named(cluster: LocalCluster) -> None:
    p = _producer(cluster, ("SdkBig",))
    try:
        with pytest.raises(Exception) as err:
            p.send(_message("SdkBig", b"x" * (LIMIT + 1)))
    finally:
        p.shutdown()
    assert str(LIMIT) in str(err.value)
    # the server's own answer, in-band, for a client that does not check first
    broker = cluster.brokers["broker-a"].commitlog.address
    with grpc.insecure_channel(broker) as ch:
        stub = service_grpc.MessagingServiceStub(ch)
        msg = v2.Message(topic=v2.Resource(name="SdkBig"), body=b"x" * (LIMIT + 1))
        msg.system_properties.message_id = "01" + "0" * 32
        r = stub.SendMessage(service.SendMessageRequest(messages=[msg]), timeout=5)
        assert r.status.code == Code.MESSAGE_BODY_TOO_LARGE and "body" in r.status.message and str(LIMIT) in r.status.message
        # every RPC Quarry does not serve answers in-band, never bare UNIMPLEMENTED
        q = stub.QueryOffset(service.QueryOffsetRequest(), timeout=5)
        assert q.status.code == Code.NOT_IMPLEMENTED and "QueryOffset" in q.status.message
        route_here = stub.QueryRoute(service.QueryRouteRequest(topic=v2.Resource(name="SdkBig")), timeout=5)
        assert route_here.status.code == Code.ILLEGAL_ACCESS_POINT


def test_acl_forbidden_topic_and_bad_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    accounts = [{"access_key": "alice", "secret_key": "alice-secret", "topics": {"SdkAcl": ["publish", "query"], "Payroll": ["query"]}}]
    with acl_cluster(tmp_path, monkeypatch, accounts, "127.0.0.54", "127.0.0.55") as c:
        p = _producer(c, ("SdkAcl",), Credentials("alice", "alice-secret"))
        try:
            ok = p.send(_message("SdkAcl", b"allowed", keys=("acl-ok",)))
            with pytest.raises(ForbiddenException) as forbidden:
                p.send(_message("Payroll", b"not allowed"))
            assert "alice" in str(forbidden.value) and "publish" in str(forbidden.value) and "Payroll" in str(forbidden.value)
        finally:
            p.shutdown()
        mallory = _producer(c, (), Credentials("alice", "wrong-secret"))
        try:
            with pytest.raises(Exception) as bad:
                mallory.send(_message("SdkAcl", b"forged"))
            assert not isinstance(bad.value, ForbiddenException)
        finally:
            mallory.shutdown()
        with grpc.insecure_channel(c.brokers["broker-a"].commitlog.address) as ch:
            r = service_grpc.MessagingServiceStub(ch).SendMessage(service.SendMessageRequest(), timeout=5)
            assert r.status.code == Code.UNAUTHORIZED and "authorization" in r.status.message
        assert c.router is not None
        with AdminClient(c.router.address) as admin:  # signed as ops (acl_cluster)
            found_everywhere(admin, "SdkAcl", ok.message_id, ok.offset, ("acl-ok",))


_TLS_SEND = """
import sys
from rocketmq import ClientConfiguration, Credentials, Message, Producer
p = Producer(ClientConfiguration(sys.argv[1], Credentials(), request_timeout=5), ("SdkTls",), tls_enable=True)
p.startup()
m = Message(); m.topic = "SdkTls"; m.body = b"over tls"; m.keys = "tls-1"
r = p.send(m)
p.shutdown()
print(r.message_id, r.offset)
"""


def test_sdk_over_tls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess
    import sys

    with tls_cluster(tmp_path, monkeypatch, "127.0.0.56", "127.0.0.57") as (c, pki):
        assert c.router is not None
        # The SDK trusts the default roots only: point gRPC's default roots at the test CA.
        sent = subprocess.run([sys.executable, "-c", _TLS_SEND, c.router.address], capture_output=True, text=True, timeout=60,
                              env={**__import__("os").environ, "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": pki["ca"]})
        assert sent.returncode == 0, sent.stderr[-2000:]
        message_id, offset = sent.stdout.split()
        with AdminClient(c.router.address) as admin:
            assert found_everywhere(admin, "SdkTls", message_id, int(offset), ("tls-1",)).body == b"over tls"
