"""Quarry following Apache RocketMQ 5.3.3's own broker (issue 36, part 1): its CommitLog,
ConsumeQueue and IndexFile are 4.x's, so the same tests run against it as against 4.9.7
(tests/e2e/test_rocketmq_broker_follow.py, which says what each proves), on a broker of its own:
every acknowledged message found four ways through Quarry's own index and --follow-index (the
latency to found logged), SIGKILL under load, a crash losing the tail cut back once, and Quarry
holding nothing but O_RDONLY descriptors there, creating nothing, the broker's logs clean. Left
to the 4.9.7 module, to keep the suite short: expiry (RocketMQ's first clean runs 60 s after it
starts) and a clean stop and start (5.3.3's shutdown hook takes 12 s, and after a clean stop it
registers with its NameServer 10 s after "boot success").
"""
from __future__ import annotations

from typing import Iterator

import pytest

from tests.e2e import test_rocketmq_broker_follow as on_4x
from tests.e2e.test_rocketmq_broker_follow import World, make_world

HOST = "127.0.0.46"  # RocketMQ 5.3.3's NameServer and broker
QUARRY_HOSTS = {"own": "127.0.0.47", "brokers-index": "127.0.0.48"}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    yield from make_world(tmp_path_factory, "5.3.3", HOST, QUARRY_HOSTS)


# The 4.9.7 module's tests, in its order, against this broker (each says what it proves).
def test_every_acknowledged_message_is_found_four_ways(world: World) -> None:
    on_4x.test_every_acknowledged_message_is_found_four_ways(world)


def test_broker_killed_under_load_and_restarted(world: World) -> None:
    on_4x.test_broker_killed_under_load_and_restarted(world)


def test_crash_losing_the_brokers_tail_is_cut_back_once(world: World) -> None:
    on_4x.test_crash_losing_the_brokers_tail_is_cut_back_once(world)


def test_quarry_never_wrote_locked_or_created_anything_and_the_broker_never_noticed(world: World) -> None:
    on_4x.test_quarry_never_wrote_locked_or_created_anything_and_the_broker_never_noticed(world)
