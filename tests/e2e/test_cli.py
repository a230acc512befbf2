"""Every `quarry` CLI command against real processes: found, not found, bad input, broker down."""
from __future__ import annotations

import json
import subprocess
from typing import Iterator

import pytest

from quarry.clients.producer import Producer
from scripts.launcher import LocalCluster
from tests.e2e.conftest import run_quarry, wait_until


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # One cluster for the module: each test below checks one command; the broker-down test,
    # which kills an indexer, runs last.
    c = LocalCluster(root=tmp_path_factory.mktemp("cli"), commitlog_args=["--segment-size", str(1 << 20)],
                     indexer_args=["--hash-slots", "101", "--index-num", "1000", "--flush-interval-ms", "100"])
    with c.running({"broker-a": "127.0.0.7", "broker-b": "127.0.0.8"}):
        yield c


def quarry(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    assert cluster.router is not None
    return run_quarry(cluster.router.address, *args)


@pytest.fixture(scope="module")
def sent(cluster: LocalCluster) -> dict[str, object]:
    """One message sent with the CLI (keys order-7 and cust-3, tag TagC), as its --json result."""
    out = quarry(cluster, "--json", "sendMessage", "-t", "CliTopic", "-p", "hello cli", "-k", "order-7 cust-3", "-c", "TagC")
    assert out.returncode == 0, out.stderr
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_send_reports_its_result_as_json_and_as_rocketmq_text(cluster: LocalCluster, sent: dict[str, object]) -> None:
    assert sent["status"] == "SEND_STATUS_SEND_OK" and len(str(sent["offsetMsgId"])) == 32 and len(str(sent["uniqueKey"])) == 32  # protobuf JSON mapping
    plain = quarry(cluster, "sendMessage", "-t", "CliTopic", "-p", "second")
    assert plain.stdout.startswith("SendResult [sendStatus=SEND_OK, msgId=") and "messageQueue=MessageQueue [topic=CliTopic" in plain.stdout


def test_query_by_id_and_by_unique_key_given_as_an_id(cluster: LocalCluster, sent: dict[str, object]) -> None:
    by_id = quarry(cluster, "queryMsgById", "-i", str(sent["offsetMsgId"]))
    assert by_id.returncode == 0 and f"OffsetID:            {sent['offsetMsgId']}" in by_id.stdout and "hello cli" in by_id.stdout
    assert "Keys:                [order-7 cust-3]" in by_id.stdout and "Tags:                [TagC]" in by_id.stdout
    by_uniq_via_id = quarry(cluster, "queryMsgById", "-i", str(sent["uniqueKey"]), "-t", "CliTopic")
    assert by_uniq_via_id.returncode == 0 and str(sent["offsetMsgId"]) in by_uniq_via_id.stdout


def test_several_ids_as_json_are_one_document_and_json_lines_one_line_each(cluster: LocalCluster, sent: dict[str, object]) -> None:
    """Issue 32: `--json queryMsgById -i a,b,c` printed a document per id back to back, which
    json.loads cannot read; it is one document now, and --json-lines prints one line per id."""
    more = [json.loads(quarry(cluster, "--json", "sendMessage", "-t", "CliTopic", "-p", f"id {n}").stdout)["offsetMsgId"] for n in range(2)]
    ids = [str(sent["offsetMsgId"]), *more]
    one = quarry(cluster, "--json", "queryMsgById", "-i", ",".join(ids))
    assert one.returncode == 0, one.stderr
    data = json.loads(one.stdout)
    assert [m["offsetMsgId"] for m in data["messages"]] == ids and len(data["tracks"]) == 3 and data["complete"]
    lines = quarry(cluster, "queryMsgById", "-i", ",".join(ids), "--json-lines").stdout.splitlines()
    assert [[m["offsetMsgId"] for m in json.loads(line)["messages"]] for line in lines] == [[i] for i in ids]


def test_query_by_key_as_json_and_as_a_table(cluster: LocalCluster, sent: dict[str, object]) -> None:
    found = wait_until(lambda: (p := quarry(cluster, "--json", "queryMsgByKey", "-t", "CliTopic", "-k", "cust-3")) and json.loads(p.stdout)["messages"] and p, what="key indexed")
    data = json.loads(found.stdout)
    assert [m["offsetMsgId"] for m in data["messages"]] == [sent["offsetMsgId"]] and data["complete"]
    table = quarry(cluster, "queryMsgByKey", "-t", "CliTopic", "-k", "order-7", "-b", "2000-01-01T00:00:00")
    assert table.stdout.splitlines()[0].startswith("#Message ID") and str(sent["uniqueKey"]) in table.stdout


def test_query_by_unique_key_and_by_queue_offset(cluster: LocalCluster, sent: dict[str, object]) -> None:
    uniq = wait_until(lambda: (p := quarry(cluster, "queryMsgByUniqueKey", "-t", "CliTopic", "-i", str(sent["uniqueKey"]))) and p.returncode == 0 and p, what="unique key indexed")
    assert str(sent["offsetMsgId"]) in uniq.stdout
    at = quarry(cluster, "queryMsgByOffset", "-t", "CliTopic", "-b", str(sent["brokerName"]), "-i", str(sent["queueId"]), "-o", str(sent["queueOffset"]))
    assert at.returncode == 0 and str(sent["offsetMsgId"]) in at.stdout


def test_topic_list_route_and_cluster_list(cluster: LocalCluster, sent: dict[str, object]) -> None:
    assert "CliTopic" in quarry(cluster, "topicList").stdout.split()
    route = json.loads(quarry(cluster, "topicRoute", "-t", "CliTopic").stdout)
    assert route["topic"] == "CliTopic" and sent["brokerName"] in [b["brokerName"] for b in route["brokers"]]
    clusters = quarry(cluster, "clusterList")
    assert "broker-a" in clusters.stdout and "broker-b" in clusters.stdout


def test_broker_status_shows_each_store_end(cluster: LocalCluster, sent: dict[str, object]) -> None:
    status = {s["brokerName"]: s["status"] for s in json.loads(quarry(cluster, "--json", "brokerStatus").stdout)["brokers"]}
    assert set(status) == {"broker-a", "broker-b"}
    # The broker that stored the message ends past it (the offsetMsgId's last 16 hex digits are its offset).
    assert int(status[str(sent["brokerName"])]["maxOffset"]) > int(str(sent["offsetMsgId"])[16:], 16)


def test_not_found_bad_input_and_broker_down_exit_codes(cluster: LocalCluster) -> None:
    missing = quarry(cluster, "queryMsgById", "-i", "7F00000700002A9F0000000000FFFFFF")
    assert missing.returncode == 1 and "not found" in missing.stderr
    bad = quarry(cluster, "queryMsgByKey", "-t", "bad topic!", "-k", "x")
    assert bad.returncode == 2 and "topic" in bad.stderr and "Traceback" not in bad.stderr
    bad_time = quarry(cluster, "queryMsgByKey", "-t", "T", "-k", "x", "-b", "yesterday")
    assert bad_time.returncode == 2 and "ISO-8601" in bad_time.stderr and "-b 'yesterday'" in bad_time.stderr
    not_offset_id = quarry(cluster, "queryMsgById", "-i", "not-an-id")
    assert not_offset_id.returncode == 2 and "-t" in not_offset_id.stderr
    assert quarry(cluster, "sendMessage", "-t", "T", "-p", "x", "-k", "a\x01b").returncode == 2

    with Producer(cluster.router.address) as p:  # type: ignore[union-attr]
        for broker in ("broker-a", "broker-b"):
            p.send("DownTopic", b"x", keys=["both"], selector=lambda qs, b: next(q for q in qs if q.broker_name == b), arg=broker)
    wait_until(lambda: len(json.loads(quarry(cluster, "--json", "queryMsgByKey", "-t", "DownTopic", "-k", "both").stdout)["messages"]) == 2, what="both indexed")
    cluster.brokers["broker-b"].indexer.kill()
    partial = quarry(cluster, "--json", "queryMsgByKey", "-t", "DownTopic", "-k", "both")
    assert partial.returncode == 4  # incomplete: a broker did not answer
    data = json.loads(partial.stdout)
    assert not data["complete"] and [m["brokerName"] for m in data["messages"]] == ["broker-a"]
    assert "broker broker-b did not answer" in partial.stderr
