"""The official RocketMQ 5 Node.js SDK (npm rocketmq-client-nodejs, pinned by
tests/e2e/node/package-lock.json; `make test` runs `npm ci` there) sends with keys and a tag
into a real Quarry cluster, with and without access control; every message is found again
through the router by the SDK's id, its key and its queue offset."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from quarry.clients.admin import AdminClient
from quarry.v1 import common_pb2
from scripts.launcher import LocalCluster
from tests.e2e.rmq5_sdk import acl_cluster, found_everywhere, tls_cluster

NODE_DIR = Path(__file__).parent / "node"


@pytest.fixture(scope="module")
def node_sdk() -> Path:
    """The pinned SDK installed (npm ci, as `make node-sdk` does, when pytest runs alone)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    assert node and npm, "Node.js and npm are required for the Node.js SDK tests"
    if not (NODE_DIR / "node_modules" / ".package-lock.json").exists():
        subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=NODE_DIR, check=True, timeout=300)
    return NODE_DIR / "send.js"


def _send(script: Path, router: str, topic: str, count: int, tag: str, key_prefix: str, env: dict[str, str] | None = None) -> list[dict]:
    run = subprocess.run(["node", str(script), router, topic, str(count), tag, key_prefix], capture_output=True, text=True,
                         timeout=120, env={**os.environ, **(env or {})})
    assert run.returncode == 0, run.stderr[-3000:]
    return [json.loads(line) for line in run.stdout.splitlines()]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(root=tmp_path / "c", indexer_args=["--hash-slots", "1001", "--index-num", "10000"])
    with c.running({"broker-a": "127.0.0.62", "broker-b": "127.0.0.63"}, router_host="127.0.0.61"):
        yield c


def test_node_sdk_sends_are_found_by_id_key_and_offset(node_sdk: Path, cluster: LocalCluster) -> None:
    assert cluster.router is not None
    receipts = _send(node_sdk, cluster.router.address, "NodeOrders", 4, "node-tag", "node-order")
    assert len({r["messageId"] for r in receipts}) == 4
    with AdminClient(cluster.router.address) as admin:
        brokers = set()
        for r in receipts:
            m = found_everywhere(admin, "NodeOrders", r["messageId"], r["offset"], tuple(r["keys"]))
            assert (m.body.decode(), m.tags, dict(m.property_pairs)["lang"]) == (r["body"], "node-tag", "nodejs")
            brokers.add(m.broker_name)
    assert brokers == {"broker-a", "broker-b"}  # the SDK spread its sends over both brokers' endpoints


def test_node_sdk_signs_with_mqv2_hmac_sha1(node_sdk: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    accounts = [{"access_key": "nodeapp", "secret_key": "node-secret", "topics": {"NodeAcl": ["publish"]}}]
    with acl_cluster(tmp_path, monkeypatch, accounts, "127.0.0.64", "127.0.0.65") as c:
        assert c.router is not None
        (r,) = _send(node_sdk, c.router.address, "NodeAcl", 1, "signed", "acl", {"RMQ_ACCESS_KEY": "nodeapp", "RMQ_SECRET_KEY": "node-secret"})
        with AdminClient(c.router.address) as admin:
            found_everywhere(admin, "NodeAcl", r["messageId"], r["offset"], tuple(r["keys"]))
        bad = subprocess.run(["node", str(node_sdk), c.router.address, "NodeAcl", "1"], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "RMQ_ACCESS_KEY": "nodeapp", "RMQ_SECRET_KEY": "wrong"})
        assert bad.returncode != 0 and "40100" in bad.stderr and "bad signature for access key 'nodeapp'" in bad.stderr


def test_node_sdk_over_tls(node_sdk: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with tls_cluster(tmp_path, monkeypatch, "127.0.0.66", "127.0.0.67") as (c, pki):
        assert c.router is not None
        # grpc-js trusts its default roots: point them at the test CA
        (r,) = _send(node_sdk, c.router.address, "NodeTls", 1, "tls", "tls", {"RMQ_TLS": "1", "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": pki["ca"], "NODE_EXTRA_CA_CERTS": pki["ca"]})
        with AdminClient(c.router.address) as admin:
            assert found_everywhere(admin, "NodeTls", r["messageId"], r["offset"], tuple(r["keys"])).body == b"hello from node 0"


def test_node_simple_consumer_receives_and_acks_what_was_sent(node_sdk: Path, cluster: LocalCluster) -> None:
    """The Node.js SDK's SimpleConsumer: every message the Node.js producer sent is received once
    with a valid body digest and acked; the group then shows each one CONSUMED."""
    assert cluster.router is not None
    receipts = _send(node_sdk, cluster.router.address, "NodeConsume", 6, "node-tag", "node-consume")
    run = subprocess.run(["node", str(NODE_DIR / "receive.js"), cluster.router.address, "NodeConsume", "NodeGroup", "6", "node-tag"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    got = [json.loads(line) for line in run.stdout.splitlines()]
    assert sorted(g["messageId"] for g in got) == sorted(r["messageId"] for r in receipts)
    assert all(not g.get("corrupted") and g["tag"] == "node-tag" and g["body"].startswith("hello from node") for g in got), got
    with AdminClient(cluster.router.address) as admin:
        for r in receipts:
            m = found_everywhere(admin, "NodeConsume", r["messageId"], r["offset"], tuple(r["keys"]))
            states = {g.group: g.state for g in admin.track("NodeConsume", m.broker_name, m.queue_id, m.queue_offset)}
            assert states["NodeGroup"] == common_pb2.CONSUME_STATE_CONSUMED
