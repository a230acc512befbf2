"""A killed broker during an oldest-first topic browse, through a real router: the page holds
the live broker's rows (never an empty page while a live broker has rows), says it is
incomplete and names the broker that did not answer, on the first page and on a continued one;
the console's JSON says the same (complete false, failedBrokers)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from quarry.clients.admin import AdminClient
from quarry.clients.console.api import Api
from quarry.clients.producer import Producer
from scripts.launcher import LocalCluster

TOPIC, BATCHES, PER_BATCH = "DeadBrowse", 40, 10


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(root=tmp_path / "cluster")
    with c.running({"broker-a": "127.0.0.91", "broker-b": "127.0.0.92"}):
        yield c


def test_an_oldest_first_page_holds_the_live_brokers_rows_and_names_the_killed_one(cluster: LocalCluster) -> None:
    assert cluster.router is not None
    router = cluster.router.address
    with Producer(router) as producer:
        for b in range(BATCHES):  # batches land on both brokers, interleaved in store time
            producer.send_batch(TOPIC, [f"{b}-{n}".encode() for n in range(PER_BATCH)], tags="TagA")
    with AdminClient(router) as admin:
        everything = admin.browse_topic(TOPIC, oldest_first=True, max_num=1024)
        assert everything.complete and len(everything.messages) == BATCHES * PER_BATCH
        on_a = [m.body for m in everything.messages if m.broker_name == "broker-a"]
        assert on_a and len(on_a) < len(everything.messages), "both brokers hold rows"
        first = admin.browse_topic(TOPIC, oldest_first=True, max_num=50)
        assert first.complete and first.next_token
        cluster.brokers["broker-b"].commitlog.kill()
        cluster.brokers["broker-b"].indexer.kill()
        for token in ("", first.next_token):
            page = admin.browse_topic(TOPIC, oldest_first=True, max_num=50, continuation_token=token)
            assert page.messages, f"an empty page although broker-a has rows (token {token!r})"
            assert {m.broker_name for m in page.messages} == {"broker-a"}
            assert not page.complete and [f.broker_name for f in page.failed_brokers] == ["broker-b"]
            times = [m.store_timestamp for m in page.messages]
            assert times == sorted(times) and page.next_token
        fresh = [m.body for m in admin.browse_topic(TOPIC, oldest_first=True, max_num=50).messages]
        assert fresh == on_a[:50]  # the live broker's oldest rows, in order
        answer = Api(admin).handle("/api/browse", {"topic": TOPIC, "order": "oldest", "pageSize": "50", "begin": "0"})
        assert answer.status == 200 and answer.body["messages"] and answer.body["complete"] is False
        assert [f["broker"] for f in answer.body["failedBrokers"]] == ["broker-b"]
        assert {m["brokerName"] for m in answer.body["messages"]} == {"broker-a"}
