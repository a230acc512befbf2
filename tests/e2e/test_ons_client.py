"""The real `ali-ons` npm client (RocketMQ 4, pure JavaScript) against Quarry: the router as its
NameServer, the commitlogs as its brokers. Its producer sends with keys and tags, its push
consumer (pulling and committing offsets through the brokers) receives each message once,
and Quarry's own CLI finds every message by id, key and unique key."""
from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
from datetime import timezone
from pathlib import Path
from typing import Iterator

import pytest

from quarry.clients.admin import AdminClient
from quarry.formats.unique_key import UniqueKeyGenerator
from scripts.launcher import LocalCluster
from quarry.services.remoting import codes
from tests.remoting_client import RemotingClient
from tests.e2e.conftest import run_quarry, wait_until

NODE_DIR = Path(__file__).resolve().parent.parent / "node"
TOPIC, GROUP = "OnsTopic", "GID_quarry_ons"


@pytest.fixture
def cluster(cluster_factory) -> Iterator[LocalCluster]:  # type: ignore[no-untyped-def]
    c = cluster_factory(indexer_args=["--hash-slots", "101", "--index-num", "1000", "--flush-interval-ms", "100"])
    c.start_router()
    c.add_broker("broker-a", "127.0.0.41")
    c.add_broker("broker-b", "127.0.0.42")
    yield c


def create_topic(c: LocalCluster, topic: str, **auth: str) -> None:
    """As `mqadmin updateTopic -c DefaultCluster` does: UPDATE_AND_CREATE_TOPIC to every broker
    (ali-ons, like Aliyun ONS, sends only to topics that exist)."""
    async def main() -> None:
        for b in c.brokers.values():
            async with RemotingClient(b.commitlog.remoting_address, **auth) as client:
                r = await client.call(codes.UPDATE_AND_CREATE_TOPIC, {"topic": topic, "defaultTopic": "TBW102", "readQueueNums": 4, "writeQueueNums": 4,
                                                                       "perm": 6, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False})
                assert r.code == codes.SUCCESS, r.remark
    asyncio.run(main())
    assert c.router is not None
    with AdminClient(c.router.address) as admin:
        wait_until(lambda: topic in admin.topics() and len(admin.topic_route(topic).brokers) == len(c.brokers), what=f"{topic} routed on every broker")


def quarry_cli(c: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    assert c.router is not None
    return run_quarry(c.router.address, "--json", *args)


def test_ali_ons_producer_and_push_consumer_through_quarry(cluster: LocalCluster) -> None:
    assert shutil.which("node"), "Node.js is needed for the ali-ons test"
    assert (NODE_DIR / "node_modules" / "ali-ons").is_dir(), "ali-ons is not installed: run `make node-clients` (make test does)"
    create_topic(cluster, TOPIC)
    ids = UniqueKeyGenerator("10.1.2.3", 4242, 77, timezone.utc)
    wanted = [{"body": f"ons-{i}", "tags": "TagA" if i % 2 else "TagB", "keys": [f"order-{i}", "ons-shared"],
               "uniqueKey": ids.next_id() if i % 2 else None} for i in range(12)]
    wanted[3]["body"] = "ons-3 " + "large body, sent zlib-compressed by ali-ons (over 4 KiB) " * 120
    assert cluster.router is not None
    env = {**os.environ, "NAMESRV_ADDR": cluster.router.remoting_address, "ONS_TOPIC": TOPIC, "ONS_GROUP": GROUP,
           "ONS_MESSAGES": json.dumps(wanted), "ONS_TIMEOUT_MS": "60000"}
    run = subprocess.run(["node", str(NODE_DIR / "ons_roundtrip.js")], env=env, capture_output=True, text=True, timeout=120, cwd=NODE_DIR)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    # The only errors allowed: the consumer's retry topic appears once its first heartbeat created it.
    assert all("%RETRY%" + GROUP in e for e in out["errors"]), out["errors"]
    sent = {s["body"]: s for s in out["sent"]}
    assert sorted(sent) == sorted(w["body"] for w in wanted) and {s["status"] for s in sent.values()} == {"SEND_OK"}
    assert {s["brokerName"] for s in sent.values()} == {"broker-a", "broker-b"}
    received = [r["body"] for r in out["received"]]
    assert sorted(received) == sorted(sent), "every message exactly once"
    by_body = {r["body"]: r for r in out["received"]}
    for w in wanted:
        got = by_body[w["body"]]
        assert got["tags"] == w["tags"] and got["keys"] == " ".join(w["keys"])
        assert got["msgId"] == sent[w["body"]]["msgId"]  # ali-ons names a message by its offsetMsgId on both sides

    # The consumer committed its offsets through the brokers: every queue consumed to its end.
    async def offsets() -> dict[tuple[str, int], tuple[int, int]]:
        found = {}
        for b in cluster.brokers.values():
            async with RemotingClient(b.commitlog.remoting_address) as client:
                for q in range(4):
                    o = await client.call(codes.QUERY_CONSUMER_OFFSET, {"consumerGroup": GROUP, "topic": TOPIC, "queueId": q})
                    m = await client.call(codes.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": q})
                    found[(b.name, q)] = (int(o.ext_fields["offset"]), int(m.ext_fields["offset"]))
        return found
    committed = asyncio.run(offsets())
    assert sum(m for _, m in committed.values()) == len(wanted)
    assert [q for q, (o, m) in committed.items() if o != m] == [], sorted(committed.items())

    cluster.wait_indexed()
    for w in wanted:
        s = sent[w["body"]]
        by_id = quarry_cli(cluster, "queryMsgById", "-i", s["msgId"])
        assert by_id.returncode == 0, by_id.stderr
        (msg,) = json.loads(by_id.stdout)["messages"]  # the protobuf JSON mapping of StoredMessage
        assert (base64.b64decode(msg["body"]).decode(), msg["offsetMsgId"], msg["tags"], msg["keys"]) == (w["body"], s["msgId"], w["tags"], w["keys"])
        assert msg.get("uniqueKey", "") == (w["uniqueKey"] or "")
        by_key = quarry_cli(cluster, "queryMsgByKey", "-t", TOPIC, "-k", w["keys"][0])
        assert [m["offsetMsgId"] for m in json.loads(by_key.stdout)["messages"]] == [s["msgId"]], by_key.stdout
        unique = w["uniqueKey"] or s["msgId"]  # without a UNIQ_KEY the offsetMsgId is the message's id
        by_uniq = quarry_cli(cluster, "queryMsgByUniqueKey", "-t", TOPIC, "-i", unique)
        assert by_uniq.returncode == 0 and [m["offsetMsgId"] for m in json.loads(by_uniq.stdout)["messages"]] == [s["msgId"]], by_uniq.stdout + by_uniq.stderr
    shared = json.loads(quarry_cli(cluster, "queryMsgByKey", "-t", TOPIC, "-k", "ons-shared").stdout)
    assert sorted(m["offsetMsgId"] for m in shared["messages"]) == sorted(s["msgId"] for s in sent.values())


def test_ali_ons_signs_its_requests_for_quarrys_acl(tmp_path: Path, cluster_factory, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """With QUARRY_ACL_FILE, ali-ons's own signing (AccessKey, OnsChannel, Signature) is what
    Quarry checks: an account with publish and query on the topic and its retry topic sends and
    consumes; an unknown secret is refused."""
    group = "GID_acl"
    acl = {"accounts": [
        {"access_key": "ops", "secret_key": "ops-secret-123", "admin": True},
        {"access_key": "app", "secret_key": "app-secret-456", "topics": {"OnsAclTopic": ["publish", "query"], f"%RETRY%{group}": ["publish", "query"]}},
    ]}
    (tmp_path / "acl.json").write_text(json.dumps(acl))
    env = {"QUARRY_ACL_FILE": str(tmp_path / "acl.json"), "QUARRY_ACCESS_KEY": "ops", "QUARRY_SECRET_KEY": "ops-secret-123"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)  # the test's own gRPC calls sign as ops
    c = cluster_factory(indexer_args=["--hash-slots", "101", "--index-num", "1000"])
    c.env = env
    c.start_router()
    c.add_broker("broker-a", "127.0.0.43")
    create_topic(c, "OnsAclTopic", access_key="ops", secret_key="ops-secret-123")
    assert c.router is not None
    wanted = [{"body": f"acl-{i}", "tags": "TagA", "keys": [f"acl-{i}"], "uniqueKey": None} for i in range(4)]
    base = {**os.environ, "NAMESRV_ADDR": c.router.remoting_address, "ONS_TOPIC": "OnsAclTopic", "ONS_GROUP": group,
            "ONS_MESSAGES": json.dumps(wanted), "ONS_TIMEOUT_MS": "60000"}
    ok = subprocess.run(["node", str(NODE_DIR / "ons_roundtrip.js")], env={**base, "ONS_ACCESS_KEY": "app", "ONS_SECRET_KEY": "app-secret-456"},
                        capture_output=True, text=True, timeout=120, cwd=NODE_DIR)
    assert ok.returncode == 0, ok.stderr[-3000:]
    out = json.loads(ok.stdout.strip().splitlines()[-1])
    assert sorted(r["body"] for r in out["received"]) == sorted(w["body"] for w in wanted)
    refused = subprocess.run(["node", str(NODE_DIR / "ons_roundtrip.js")], env={**base, "ONS_ACCESS_KEY": "app", "ONS_SECRET_KEY": "wrong"},
                             capture_output=True, text=True, timeout=120, cwd=NODE_DIR)
    assert refused.returncode != 0 and "Signature does not match" in refused.stderr
