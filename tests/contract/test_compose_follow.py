"""compose.follow.yaml (Quarry beside a running RocketMQ broker) checked by the real Docker
Compose v2 parser: valid, the broker's store mounted read-only in every Quarry service that
sees it, follow settings on, the broker's address required."""
from __future__ import annotations

import json
from pathlib import Path

from tests.contract.test_compose import REPO, compose_config

FILE = REPO / "compose.follow.yaml"
ENV = {"ROCKETMQ_STORE": "/var/lib/rocketmq/store", "ROCKETMQ_BROKER_ADDR": "10.0.0.7:10911"}


def test_follow_compose_mounts_the_store_read_only_and_follows_it() -> None:
    result = compose_config(FILE, env=ENV)
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    assert set(services) == {"router", "commitlog-a", "indexer-a"}
    for name in ("commitlog-a", "indexer-a"):
        mounts = [v for v in services[name]["volumes"] if v["source"] == ENV["ROCKETMQ_STORE"]]
        assert mounts and all(v.get("read_only") for v in mounts), f"{name}: {services[name]['volumes']}"
    commitlog = services["commitlog-a"]["environment"]
    assert commitlog["QUARRY_FOLLOW"] == "true" and commitlog["QUARRY_STORE_HOST"] == ENV["ROCKETMQ_BROKER_ADDR"]
    assert commitlog["QUARRY_STORE_DIR"] == "/rocketmq/store"
    indexer = services["indexer-a"]["environment"]
    assert indexer["QUARRY_INDEX_FOLLOW"] == "true" and indexer["QUARRY_INDEX_DIR"] == "/rocketmq/store"
    assert [p["target"] for p in services["router"]["ports"]] == [9876]  # only the router is published
    assert not services["commitlog-a"].get("ports") and not services["indexer-a"].get("ports")


def test_follow_compose_needs_the_brokers_store_and_address(tmp_path: Path) -> None:
    for missing in ENV:
        env = {k: v for k, v in ENV.items() if k != missing}
        result = compose_config(FILE, env={**env, missing: ""})
        assert result.returncode != 0 and missing in result.stderr, result.stderr
