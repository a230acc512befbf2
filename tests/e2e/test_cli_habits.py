"""The CLI as RocketMQ users type it (issue 15 items 4, 7, 10-13), against real processes:
mqadmin's long options, -n lists with fail-over, --json anywhere in one JSON shape, comma-
separated ids, exit codes, times pasted back as printed, IPv6 store hosts, `| head`."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from quarry.clients.producer import Producer
from scripts.launcher import LocalCluster, free_port
from tests.e2e.conftest import Launch, run_quarry, wait_until

TOPIC = "HabitTopic"


@pytest.fixture
def cluster(cluster_factory) -> Iterator[LocalCluster]:  # type: ignore[no-untyped-def]
    c = cluster_factory(commitlog_args=["--segment-size", str(1 << 20)], indexer_args=["--hash-slots", "101", "--index-num", "1000", "--flush-interval-ms", "50"])
    c.start_router()
    c.add_broker("broker-a", "127.0.0.31")
    c.add_broker("broker-b", "127.0.0.32")
    yield c


def quarry(router: str | None, *args: str, tz: str = "Asia/Kolkata") -> subprocess.CompletedProcess[str]:
    return run_quarry(router, *args, env={"TZ": tz})


def _dead_address() -> str:
    return f"127.0.0.1:{free_port()}"


def test_mqadmin_options_router_lists_json_anywhere_and_exit_codes(cluster: LocalCluster) -> None:
    router = cluster.router.address  # type: ignore[union-attr]
    with Producer(f"{_dead_address()};{router}") as p:  # the first router is down: fail over
        sent = [p.send(TOPIC, f"m{i}".encode(), keys="gamma delta") for i in range(3)]  # a string is split, as setKeys(String)
    both = f"{_dead_address()};{router}"
    found = wait_until(lambda: (r := quarry(None, "queryMsgByKey", "--namesrvAddr", both, "--topic", TOPIC, "--msgKey", "delta", "--json"))
                       and r.returncode == 0 and len(json.loads(r.stdout)["messages"]) == 3 and r, what="indexed")
    data = json.loads(found.stdout)
    # One JSON shape: the protobuf JSON mapping (lowerCamelCase, int64 as strings, every field).
    assert set(data) >= {"messages", "brokers", "complete", "collisionsFiltered", "nextContinuationToken"}
    assert {m["offsetMsgId"] for m in data["messages"]} == {s.offset_msg_id for s in sent}
    assert all(m["keys"] == ["gamma", "delta"] and isinstance(m["queueOffset"], str) for m in data["messages"])
    before = json.loads(quarry(router, "--json", "queryMsgByKey", "-t", TOPIC, "-k", "gamma").stdout)
    after = json.loads(quarry(router, "queryMsgByKey", "-t", TOPIC, "-k", "gamma", "--json").stdout)
    assert before["messages"] == after["messages"] and len(after["messages"]) == 3

    # Comma-separated ids; one unknown id makes the exit code 1 and is named.
    ids = ",".join(s.offset_msg_id for s in sent[:2])
    two = quarry(router, "queryMsgById", "--msgId", ids)
    assert two.returncode == 0 and all(s.offset_msg_id in two.stdout for s in sent[:2]), two.stderr
    unknown = "7F00001F00002A9F0000000000FFFFFF"
    partly = quarry(router, "queryMsgById", "-i", f"{sent[0].offset_msg_id},{unknown}")
    assert partly.returncode == 1 and sent[0].offset_msg_id in partly.stdout and unknown in partly.stderr

    # Exit codes: 1 nothing found, 2 bad input naming the flag as typed, 3 no router.
    nothing = quarry(router, "queryMsgByKey", "-t", TOPIC, "-k", "no-such-key")
    assert nothing.returncode == 1 and "not found" in nothing.stderr
    secs = quarry(router, "queryMsgByKey", "-t", TOPIC, "-k", "gamma", "--beginTimestamp", "1700000000")
    assert secs.returncode == 2 and "--beginTimestamp '1700000000'" in secs.stderr and "seconds" in secs.stderr
    bad_n = quarry(None, "clusterList", "-n", "no-port")
    assert bad_n.returncode == 2 and "-n" in bad_n.stderr and "Traceback" not in bad_n.stderr
    down = quarry(None, "clusterList", "-n", f"{_dead_address()};{_dead_address()}")
    assert down.returncode == 3 and "no router answered" in down.stderr
    assert "4  incomplete" in quarry(None, "--help").stdout and "4  incomplete" in quarry(None, "queryMsgByKey", "--help").stdout

    # Long options of queryMsgByOffset and queryMsgByUniqueKey.
    at = quarry(router, "queryMsgByOffset", "--topic", TOPIC, "--brokerName", sent[0].message_queue.broker_name,
                "--queueId", str(sent[0].message_queue.queue_id), "--offset", str(sent[0].queue_offset))
    assert at.returncode == 0 and sent[0].offset_msg_id in at.stdout
    uniq = quarry(router, "queryMsgByUniqueKey", "--topic", TOPIC, "--msgId", sent[1].msg_id, "--showAll")
    assert uniq.returncode == 0 and sent[1].offset_msg_id in uniq.stdout


def test_printed_times_paste_back_in_the_same_zone(cluster: LocalCluster) -> None:
    router = cluster.router.address  # type: ignore[union-attr]
    with Producer(router) as p:
        sent = p.send(TOPIC, b"when", keys=["when"])
    table = wait_until(lambda: (r := quarry(router, "queryMsgByKey", "-t", TOPIC, "-k", "when")) and r.returncode == 0 and r, what="indexed")
    printed = re.search(r"(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2},\d{3})\s*$", table.stdout.splitlines()[1]).group(1)  # type: ignore[union-attr]
    exact = quarry(router, "queryMsgByKey", "-t", TOPIC, "-k", "when", "-b", printed, "-e", printed)
    assert exact.returncode == 0 and sent.msg_id in exact.stdout, exact.stderr
    # The same instant in UTC with Z, read by a CLI in another zone, finds it too.
    stored = json.loads(quarry(router, "queryMsgById", "-i", sent.offset_msg_id, "--json").stdout)["messages"][0]
    ms = int(stored["storeTimestamp"])
    from datetime import datetime, timezone
    iso = datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"
    assert sent.msg_id in quarry(router, "queryMsgByKey", "-t", TOPIC, "-k", "when", "-b", iso, "-e", iso, tz="America/New_York").stdout


def test_ipv6_store_host_is_printed_in_brackets_and_head_ends_quietly(tmp_path: Path, launch: Launch) -> None:
    with socket.socket(socket.AF_INET6) as s:
        s.bind(("::1", 0))
        port = s.getsockname()[1]
    router = launch("router", "--heartbeat-interval-ms", "200")
    cl = launch("commitlog", "--store-dir", str(tmp_path / "s"), "--router", router.address, "--broker-name", "broker-6",
                "--heartbeat-interval-ms", "200", host="[::1]", port=port)
    wait_until(lambda: "broker-6" in quarry(router.address, "clusterList").stdout, what="registered")
    [info] = json.loads(quarry(router.address, "clusterList", "--json").stdout)["brokers"]
    store_host = info["storeHost"]
    assert store_host.startswith("[::1]:") and info["commitlogAddr"] == f"[::1]:{port}"
    assert store_host in quarry(router.address, "clusterList").stdout
    out = quarry(router.address, "sendMessage", "-t", TOPIC, "-p", "v6", "--json")
    assert out.returncode == 0, out.stderr
    sent = json.loads(out.stdout)
    shown = quarry(router.address, "queryMsgById", "-i", sent["offsetMsgId"])
    assert shown.returncode == 0 and f"Store Host:          {store_host}" in shown.stdout and "Born Host:           [::1]:" in shown.stdout, shown.stdout
    assert cl.address == f"[::1]:{port}"
    # A reader that leaves at once: no traceback, no "Exception ignored".
    proc = subprocess.Popen([sys.executable, "-m", "quarry.clients", "queryMsgById", "-i", sent["offsetMsgId"]], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "NAMESRV_ADDR": router.address}, cwd=tempfile.gettempdir())
    assert proc.stdout is not None
    proc.stdout.close()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and b"Traceback" not in err and b"Exception ignored" not in err, err
