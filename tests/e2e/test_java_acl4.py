"""Apache RocketMQ 4.9.8's Java client under Quarry's ACL (issue 35, item 6): a router and a broker
with QUARRY_ACL_FILE (Quarry's own processes, and this test's quarry.v1 calls, signed as the admin
`ops`), a DefaultMQProducer and DefaultMQPushConsumers signing every request with
`AclClientRPCHook(new SessionCredentials(ak, sk))` (tests/java/.../Consumer4.java, one JVM).

- `jpub` (publish on J4Acl) sends to J4Acl; its send to J4Secret is refused with NO_PERMISSION;
  with a wrong secret nothing it sends is stored.
- `jcon` (query on J4Acl; sub on the groups J4AclGroup and J4SecretGroup, no other group)
  consumes J4Acl in J4AclGroup; joining J4SecretGroup to consume J4Secret, or J4OtherGroup to
  consume J4Acl, its heartbeat is refused (NO_PERMISSION, in the client's own log and Quarry's):
  it never joins; its own GET_MAX_OFFSET on J4Secret is refused with NO_PERMISSION.
- with -Dtls.enable=true the client fails at once on the plaintext remoting port.

The 4.x client's exceptions carry the code, not its name: "CODE: 16  DESC: access key jpub lacks
publish permission on J4Secret" (16 is NO_PERMISSION in RocketMQ's ResponseCode; the driver names it)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import pytest

from quarry.clients.admin import AdminClient
from quarry.clients.producer import Producer
from scripts.launcher import LocalCluster
from tests.e2e import java
from tests.e2e.rmq5_sdk import acl_cluster

ACCOUNTS = [
    {"access_key": "jpub", "secret_key": "jpub-secret-1", "topics": {"J4Acl": ["publish"]}},
    {"access_key": "jcon", "secret_key": "jcon-secret-22", "topics": {"J4Acl": ["query"]},
     "groups": {"J4AclGroup": ["sub"], "J4SecretGroup": ["sub"]}, "default_group_perms": []},
]
PUB = {"accessKey": "jpub", "secretKey": "jpub-secret-1"}
CON = {"accessKey": "jcon", "secretKey": "jcon-secret-22"}
OK_KEYS = [f"acl4-{i}" for i in range(4)]


def msg(topic: str, key: str) -> dict[str, Any]:
    return {"topic": topic, "tags": "TagAcl", "keys": [key], "body": f"body of {key}"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with pytest.MonkeyPatch.context() as mp, acl_cluster(tmp_path_factory.mktemp("java-acl4"), mp, ACCOUNTS, "127.0.0.161", "127.0.0.162") as c:
        yield c


def test_java4_client_with_acl_client_rpc_hook_admitted_for_its_permissions_and_refused_beyond(cluster: LocalCluster, tmp_path: Path) -> None:
    c = cluster
    assert c.router is not None
    with Producer(c.router.address) as p:  # signed as ops (admin): J4Secret exists, with two messages
        secret = [p.send("J4Secret", f"secret {i}".encode(), keys=[f"secret-{i}"]) for i in range(2)]
    steps = [
        {"op": "send", "group": "J4PG", **PUB, "messages": [msg("J4Acl", k) for k in OK_KEYS]},
        {"op": "send", "group": "J4PG", **PUB, "mayFail": True, "messages": [msg("J4Secret", "acl4-forbidden")]},
        {"op": "send", "group": "J4PG2", "accessKey": "jpub", "secretKey": "wrong-secret", "mayFail": True,
         "messages": [msg("J4Acl", "acl4-forged")]},
        {"op": "push", "name": "c1", "group": "J4AclGroup", **CON, "subscriptions": {"J4Acl": "*"}},
        {"op": "await", "consumers": ["c1"], "keys": OK_KEYS},
        {"op": "maxOffset", "consumer": "c1", "topic": "J4Acl"},
        {"op": "maxOffset", "consumer": "c1", "topic": "J4Secret"},
        {"op": "push", "name": "c2", "group": "J4SecretGroup", **CON, "subscriptions": {"J4Secret": "*"}},
        {"op": "push", "name": "c3", "group": "J4OtherGroup", **CON, "subscriptions": {"J4Acl": "*"}},
    ]
    plan = {"namesrv": c.router.remoting_address, "steps": steps}
    work = tmp_path / "jvm"
    # INFO: MQClientInstance logs a refused heartbeat at INFO ("send heart beat to broker[...] failed").
    lines = java.run_driver("quarry.drivers.Consumer4", plan, work_dir=work, timeout_s=150,
                            jvm_args=["-Drocketmq.client.logLevel=INFO"])

    sent = {x["sent"]: x for x in lines if "sent" in x}
    assert all(sent[k]["status"] == "SEND_OK" for k in OK_KEYS), sent
    forbidden = sent["acl4-forbidden"]
    assert forbidden["code"] == 16 and forbidden["codeName"] == "NO_PERMISSION", forbidden
    assert "CODE: 16" in forbidden["causes"] and "jpub lacks publish permission on J4Secret" in forbidden["causes"], forbidden
    forged = sent["acl4-forged"]
    # the router refuses the route lookup (GET_ROUTEINFO_BY_TOPIC) a wrong signature asks: no broker is even tried
    assert "No route info of this topic: J4Acl" in forged["error"] and "status" not in forged, forged

    (awaited,) = [x for x in lines if x.get("awaited") == ["c1"]]
    assert awaited["ok"], awaited
    consumed = [x for x in lines if "consumed" in x]
    assert sorted({x["key"] for x in consumed if x["consumed"] == "c1"}) == OK_KEYS
    assert [x for x in consumed if x["consumed"] != "c1" or x["topic"] != "J4Acl"] == []

    probes = {x["topic"]: x["queues"] for x in lines if "maxOffset" in x}
    assert sum(probes["J4Acl"].values()) == len(OK_KEYS), probes  # answered: every message of J4Acl
    refused = list(probes["J4Secret"].values())
    assert refused and all(r["code"] == 16 and r["codeName"] == "NO_PERMISSION" and "lacks query permission on J4Secret" in r["causes"]
                           for r in refused), refused

    started = {x["started"] for x in lines if "started" in x}
    assert started == {"c1", "c2", "c3"}  # start() does not ask the broker: the heartbeat is refused after
    client_log = "\n".join(f.read_text(errors="replace") for f in (work / "client-logs").rglob("*.log"))
    refusals = re.findall(r"send heart beat to broker\[.*?\] failed.*?\n.*?CODE: 16\s+DESC: ([^\n]*)", client_log)
    assert any("jcon lacks query permission on J4Secret" in r for r in refusals), refusals or client_log[-3000:]
    assert any("jcon lacks the sub permission on consumer group J4OtherGroup" in r for r in refusals), refusals

    router_log = c.router.log_path.read_text(errors="replace")
    assert re.search(r'request_code=105 access_key=jpub reason="Signature does not match', router_log)  # the forged route lookup
    (broker,) = c.brokers.values()
    broker_log = broker.commitlog.log_path.read_text(errors="replace")
    assert 'request_code=34 access_key=jcon reason="access key jcon lacks query permission on J4Secret"' in broker_log  # HEART_BEAT
    assert 'request_code=34 access_key=jcon reason="access key jcon lacks the sub permission on consumer group J4OtherGroup"' in broker_log
    with AdminClient(c.router.address) as admin:
        assert admin.query_by_key("J4Acl", "acl4-forged").messages == []
        assert admin.query_by_key("J4Secret", "acl4-forbidden").messages == []
    assert {s.message_queue.broker_name for s in secret}


def test_java4_client_with_tls_enabled_fails_fast_on_the_plaintext_remoting_port(cluster: LocalCluster, tmp_path: Path) -> None:
    """Quarry's remoting ports serve no TLS. RocketMQ 4.9.8 with -Dtls.enable=true opens its first
    connection (to the NameServer) with a TLS ClientHello; Quarry closes it, naming the handshake,
    and the client's first call fails at once: producer.send throws IllegalStateException
    (RemotingSendRequestException "send request to <addr> failed", from a ClosedChannelException
    its SslHandler raises). A push consumer's start() throws the same."""
    assert cluster.router is not None
    plan = {"namesrv": cluster.router.remoting_address, "group": "J4TlsPG", "timeoutMs": 5000, **PUB,
            "sends": [{"mode": "sync", "messages": [msg("J4Acl", "acl4-tls")]}]}
    lines = java.run_driver("quarry.drivers.Producer4", plan, work_dir=tmp_path / "jvm", jvm_args=["-Dtls.enable=true"])
    (refused,) = [x for x in lines if "error" in x]
    addr = cluster.router.remoting_address
    assert refused["error"].startswith("java.lang.IllegalStateException: org.apache.rocketmq.remoting.exception.RemotingSendRequestException: "
                                       f"send request to <{addr}> failed"), refused
    assert refused["causes"].endswith("java.nio.channels.ClosedChannelException: null"), refused
    router_log = cluster.router.log_path.read_text(errors="replace")
    assert 'reason="a TLS handshake: the client has TLS on' in router_log
