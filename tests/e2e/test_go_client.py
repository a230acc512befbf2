"""Apache RocketMQ's Go client (rocketmq-client-go/v2, pinned by tests/go/go.mod) against a real
Quarry cluster (issue 35, item 5): a second independent implementation of RocketMQ 4's remoting
protocol, with the router's remoting port as its NameServer. A producer sends synchronously with
keys, tags and user properties across two brokers; a push consumer (clustering, from the first
offset) consumes every message exactly once; Quarry's CLI finds every message by offsetMsgId, by
key and by unique key (the msgId the Go producer returned). The driver is
tests/go/rmq4/main.go, built by `make go-clients` (which `make test` runs)."""
from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest

from scripts.launcher import LocalCluster
from tests.e2e.conftest import run_quarry

GO_DIR = Path(__file__).resolve().parent.parent / "go"
DRIVER = GO_DIR / "bin" / "rmq4"
TOPIC, COUNT = "GoClientTopic", 12


def driver() -> str:
    """The built driver; fails naming what is missing (Go, or the build) and what brings it."""
    if not DRIVER.is_file():
        why = "no `go` on PATH: Go 1.21 or later is needed" if shutil.which("go") is None else f"{DRIVER} is not built"
        pytest.fail(f"RocketMQ's Go client: {why}; run `make go-clients` (`make test` runs it)", pytrace=False)
    built = DRIVER.stat().st_mtime
    stale = [p for p in [GO_DIR / "go.mod", GO_DIR / "go.sum", *GO_DIR.rglob("*.go")] if p.stat().st_mtime > built]
    if stale:
        pytest.fail(f"tests/go changed since the last build ({', '.join(str(p.relative_to(GO_DIR)) for p in stale[:3])}): run `make go-clients`",
                    pytrace=False)
    return str(DRIVER)


def run_driver(plan: dict[str, Any], timeout_s: float = 90) -> list[dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if k != "NAMESRV_ADDR"}
    env["ROCKETMQ_GO_LOG_LEVEL"] = "warn"
    run = subprocess.run([driver()], input=json.dumps(plan), capture_output=True, text=True, timeout=timeout_s, env=env)
    assert run.returncode == 0, f"rmq4 exited {run.returncode}\nstdout: {run.stdout[-3000:]}\nstderr: {run.stderr[-3000:]}"
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert lines and lines[-1] == {"done": True}, (lines[-3:], run.stderr[-3000:])
    return lines[:-1]


def spec(i: int) -> dict[str, Any]:
    return {"topic": TOPIC, "tags": "TagA" if i % 2 else "TagB", "keys": [f"go-{i}", "go-shared"], "props": {"lang": "go", "n": str(i)},
            "body": f"go body {i}"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(root=tmp_path_factory.mktemp("go-client"), indexer_args=["--hash-slots", "101", "--index-num", "4000", "--flush-interval-ms", "100"])
    with c.running({"broker-a": "127.0.0.112", "broker-b": "127.0.0.113"}, router_host="127.0.0.111"):
        yield c


@pytest.fixture(scope="module")
def events(cluster: LocalCluster) -> list[dict[str, Any]]:
    assert cluster.router is not None
    plan = {"namesrv": cluster.router.remoting_address, "timeoutMs": 10000,
            "produce": {"group": "PG_quarry_go", "messages": [spec(i) for i in range(COUNT)]},
            "consume": {"group": "CG_quarry_go", "topic": TOPIC, "want": COUNT, "deadlineMs": 30000, "settleMs": 1000}}
    lines = run_driver(plan)
    cluster.wait_indexed()
    return lines


def quarry(c: LocalCluster, *args: str) -> list[dict[str, Any]]:
    assert c.router is not None
    run = run_quarry(c.router.address, "--json", *args)
    assert run.returncode in (0, 1), f"quarry exited {run.returncode}: {run.stderr[-2000:]}"
    return json.loads(run.stdout).get("messages", []) if run.stdout.strip() else []


def test_every_sync_send_is_acknowledged_by_both_brokers(events: list[dict[str, Any]]) -> None:
    sent = [e for e in events if e["op"] == "sent"]
    assert [e.get("error") for e in sent] == [None] * COUNT
    assert all(e["status"] == 0 and len(e["offsetMsgId"]) == 32 and e["msgId"] for e in sent)  # SendOK
    assert {e["brokerName"] for e in sent} == {"broker-a", "broker-b"}
    assert len({e["msgId"] for e in sent}) == len({e["offsetMsgId"] for e in sent}) == COUNT


def test_every_message_found_by_offset_msg_id_key_and_unique_key(cluster: LocalCluster, events: list[dict[str, Any]]) -> None:
    sent = {e["index"]: e for e in events if e["op"] == "sent"}
    by_id = {m["offsetMsgId"]: m for m in quarry(cluster, "queryMsgById", "-i", ",".join(e["offsetMsgId"] for e in sent.values()))}
    assert sorted(by_id) == sorted(e["offsetMsgId"] for e in sent.values())
    for i, e in sent.items():
        m, want = by_id[e["offsetMsgId"]], spec(i)
        props = {p["name"]: p.get("value", "") for p in m.get("properties", [])}
        assert (m["topic"], m["tags"], m["keys"], base64.b64decode(m["body"]).decode()) == (TOPIC, want["tags"], want["keys"], want["body"])
        assert props["lang"] == "go" and props["n"] == str(i) and m["uniqueKey"] == e["msgId"] == props["UNIQ_KEY"]
        assert [k["offsetMsgId"] for k in quarry(cluster, "queryMsgByKey", "-t", TOPIC, "-k", f"go-{i}")] == [e["offsetMsgId"]]
        assert [u["offsetMsgId"] for u in quarry(cluster, "queryMsgByUniqueKey", "-t", TOPIC, "-i", e["msgId"])] == [e["offsetMsgId"]]
    shared = quarry(cluster, "queryMsgByKey", "-t", TOPIC, "-k", "go-shared")
    assert sorted(m["uniqueKey"] for m in shared) == sorted(e["msgId"] for e in sent.values())


def test_push_consumer_consumes_every_message_exactly_once(events: list[dict[str, Any]]) -> None:
    sent = {e["msgId"]: e for e in events if e["op"] == "sent"}
    consumed = [e for e in events if e["op"] == "consumed"]
    assert sorted(e["msgId"] for e in consumed) == sorted(sent)  # each once, none twice
    for e in consumed:
        s, want = sent[e["msgId"]], spec(sent[e["msgId"]]["index"])
        assert (e["offsetMsgId"], e["brokerName"], e["queueId"], e["queueOffset"]) == (s["offsetMsgId"], s["brokerName"], s["queueId"], s["queueOffset"])
        assert (e["topic"], e["tags"], e["keys"], e["body"], e["reconsumeTimes"]) == (TOPIC, want["tags"], " ".join(want["keys"]), want["body"], 0)
        assert e["props"]["lang"] == "go" and e["props"]["n"] == want["props"]["n"]
