"""A dead broker's store, queried offline: a COPY of each golden RocketMQ store under
tests/golden/messages (CommitLog segments only: no consumequeue/, no config/) served
read-only by a commitlog dialled at one address while its records carry other store hosts.
Every record is found by offsetMsgId, key, unique key and queue offset through the router,
and no file of the copy changes."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from quarry.clients.admin import AdminClient
from quarry.formats.record import SYSFLAG_TRANSACTION_MASK, SYSFLAG_TRANSACTION_ROLLBACK, takes_queue_offset
from quarry.formats.topic import is_valid_topic
from tests.e2e.conftest import wait_until
from tests.tree import tree_snapshot
from tests.vectors import REPO_ROOT

GOLDEN = REPO_ROOT / "tests" / "golden" / "messages"
SCENARIOS = sorted(p.parent.name for p in GOLDEN.glob("*/scenario.json"))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_a_dead_brokers_store_answers_every_query_read_only(scenario: str, tmp_path: Path, cluster_factory) -> None:  # type: ignore[no-untyped-def]
    golden = json.loads((GOLDEN / scenario / "scenario.json").read_text())
    store = tmp_path / "dead-broker-store"
    shutil.copytree(GOLDEN / scenario / "commitlog", store / "commitlog")
    before = tree_snapshot(store)
    records = [r["decoded"] for m in golden["messages"] for r in m["records"]]
    first_host = records[0]["store_host"]

    cluster = cluster_factory(indexer_args=["--hash-slots", "101", "--index-num", "1000", "--flush-interval-ms", "100"])
    router = cluster.start_router()
    broker = cluster.add_broker("dead-broker", "127.0.0.61", commitlog_args=[
        "--store-dir", str(store), "--read-only", "true",
        # Dialled at 127.0.0.61:<port>; the ids it answers for name the dead broker's address.
        "--store-host", first_host if ":" not in first_host.rpartition(":")[0] else "[{}]:{}".format(*first_host.rsplit(":", 1)),
    ])
    cluster.wait_indexed()

    with AdminClient(router.address) as admin:
        wait_until(lambda: admin.brokers(), what="the dead broker's store registered")
        for rec in records:
            label = f"{scenario} record at {rec['commit_log_offset']}"
            by_id = admin.query_by_id(rec["msg_id"]).messages
            assert [m.commit_log_offset for m in by_id] == [rec["commit_log_offset"]], label
            # The vector holds the body as MessageDecoder.decode gives it (inflated when sys flag
            # 0x1 says compressed, the flag kept), and so does the answer.
            assert by_id[0].body.hex() == rec["body_hex"] and by_id[0].sys_flag == rec["sys_flag"] and by_id[0].topic == rec["topic"], label
            if not is_valid_topic(rec["topic"]):
                continue  # the router refuses the name (RocketMQ's rule); found by id above
            indexed = rec["sys_flag"] & SYSFLAG_TRANSACTION_MASK != SYSFLAG_TRANSACTION_ROLLBACK
            for key in (rec["keys"] or "").split(" "):
                if key and indexed:
                    found = admin.query_by_key(rec["topic"], key, max_num=64).messages
                    assert rec["msg_id"] in {m.offset_msg_id for m in found}, f"{label}: key {key}"
            if rec["uniq_key"] and indexed:  # ids of 2023: found by the router's widened search
                found = admin.query_by_unique_key(rec["topic"], rec["uniq_key"], return_all=True).messages
                assert rec["msg_id"] in {m.offset_msg_id for m in found}, f"{label}: unique key"
            if takes_queue_offset(rec["sys_flag"]):
                at = admin.query_by_offset(rec["topic"], "dead-broker", rec["queue_id"], rec["queue_offset"]).messages
                assert [m.offset_msg_id for m in at] == [rec["msg_id"]], f"{label}: queue offset {rec['queue_offset']}"

    cluster.stop()
    assert tree_snapshot(store) == before  # nothing written, created or touched
    log = broker.commitlog.log_path.read_text()
    assert "queues rebuilt in memory" in log
