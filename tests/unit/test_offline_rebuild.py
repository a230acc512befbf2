"""A read-only store without consumequeue/ (a dead broker's CommitLog): topics, queues and queue
offsets rebuilt in memory from every golden RocketMQ store, nothing written."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from quarry.formats.record import takes_queue_offset
from quarry.services.commitlog.storage.consume_queue_store import MemoryConsumeQueue
from quarry.services.commitlog.storage.store import CommitLogStore, StoreConfig
from tests.vectors import REPO_ROOT

GOLDEN = REPO_ROOT / "tests" / "golden" / "messages"
SCENARIOS = sorted(p.parent.name for p in GOLDEN.glob("*/scenario.json"))


def _host(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_queues_are_rebuilt_in_memory_from_the_log(scenario: str, tmp_path: Path) -> None:
    golden = json.loads((GOLDEN / scenario / "scenario.json").read_text())
    records = [r["decoded"] for m in golden["messages"] for r in m["records"]]
    shutil.copytree(GOLDEN / scenario / "commitlog", tmp_path / "commitlog")
    names_before = sorted(p.name for p in tmp_path.rglob("*"))
    store = CommitLogStore(StoreConfig(store_dir=tmp_path, read_only=True))
    try:
        assert store.state.rebuild_in_memory and not store.state.corruption
        assert store.state.store_hosts_seen == {_host(r["store_host"]) for r in records}
        queued = [r for r in records if takes_queue_offset(r["sys_flag"])]
        for rec in queued:
            assert store.topics[rec["topic"]] > rec["queue_id"]
            got, _next, _lo, _hi = store.pull(rec["topic"], rec["queue_id"], rec["queue_offset"], 1)
            assert [g.physical_offset for g in got] == [rec["commit_log_offset"]]
        expected = {}
        for rec in queued:
            key = (rec["topic"], rec["queue_id"])
            expected[key] = max(expected.get(key, 0), rec["queue_offset"] + 1)
        assert {k: cq.max_offset for k, cq in store.cqs.queues.items()} == expected
    finally:
        store.close()
    assert sorted(p.name for p in tmp_path.rglob("*")) == names_before  # no consumequeue/, config/, checkpoint or abort


def test_a_read_only_store_with_consume_queues_reads_them_from_disk(tmp_path: Path) -> None:
    (tmp_path / "consumequeue").mkdir()
    shutil.copytree(GOLDEN / SCENARIOS[0] / "commitlog", tmp_path / "commitlog")
    store = CommitLogStore(StoreConfig(store_dir=tmp_path, read_only=True))
    try:
        assert not store.state.rebuild_in_memory and not store.cqs.queues
    finally:
        store.close()


def test_memory_queue_keeps_holes_and_out_of_order_units() -> None:
    q = MemoryConsumeQueue()
    unit = lambda phy: phy.to_bytes(8, "big") + (10).to_bytes(4, "big") + (0).to_bytes(8, "big")  # noqa: E731
    q.write_units(5, unit(500))
    q.write_units(7, unit(700))
    assert (q.min_offset, q.max_offset) == (5, 8)
    assert q.read_units(5, 10) == [(500, 10, 0)]  # stops at the hole at 6, as a file queue does
    q.write_units(3, unit(300))
    assert (q.min_offset, q.max_offset) == (3, 8)
    assert q.read_units(7, 1) == [(700, 10, 0)] and q.read_units(2, 1) == []
    q.truncate_from_phy(700)
    assert q.max_offset == 6
