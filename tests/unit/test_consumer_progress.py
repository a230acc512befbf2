"""GetConsumerProgress on the broker's side (services/commitlog/broker/consumer_progress.py):
each queue's offset range, and each group's position and lag in it, from committed consumer
offsets (RocketMQ 4) and from RocketMQ 5 pop state; a group past the queue's end owes nothing,
an empty queue (no ConsumeQueue yet) has the range 0..0, retention-deleted messages are not owed."""
from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from quarry.services.commitlog.broker.consumer_progress import GroupProgress, QueueRange, lag, progress, queue_ranges
from quarry.services.commitlog.storage.consumer_groups import ConsumerGroups, Pending
from quarry.services.commitlog.storage.consumer_offsets import ConsumerOffsets


class Cqs:
    def __init__(self, ranges: dict[tuple[str, int], tuple[int, int]]) -> None:
        self.ranges = ranges

    def existing(self, topic: str, queue_id: int) -> SimpleNamespace | None:
        r = self.ranges.get((topic, queue_id))
        return None if r is None else SimpleNamespace(min_offset=r[0], max_offset=r[1])


@pytest.fixture
def state() -> SimpleNamespace:
    # T: queue 0 holds 0..10, queue 1 5..12 (retention deleted 0..5), queue 2 never written; U: 0..3
    return SimpleNamespace(lock=threading.Lock(), topics={"T": 3, "U": 1}, cqs=Cqs({("T", 0): (0, 10), ("T", 1): (5, 12), ("U", 0): (0, 3)}))


def test_queue_ranges_name_every_queue_and_an_empty_one_is_0_to_0(state: SimpleNamespace) -> None:
    assert queue_ranges(state) == [QueueRange("T", 0, 0, 10), QueueRange("T", 1, 5, 12), QueueRange("T", 2, 0, 0), QueueRange("U", 0, 0, 3)]
    assert queue_ranges(state, "U") == [QueueRange("U", 0, 0, 3)]
    assert queue_ranges(state, "Nope") == []


@pytest.mark.parametrize("consumer, low, high, owed", [
    (4, 0, 10, 6),  # behind: what follows its offset
    (10, 0, 10, 0),  # at the end
    (15, 0, 10, 0),  # past the queue's end (a reset offset, or the log cut back): owes nothing, never negative
    (2, 5, 12, 7),  # below what retention kept: the deleted messages are not owed
    (0, 0, 0, 0),  # an empty queue
])
def test_lag(consumer: int, low: int, high: int, owed: int) -> None:
    assert lag(consumer, low, high) == owed


def test_progress_from_committed_offsets_and_pop_state(state: SimpleNamespace, tmp_path: Path) -> None:
    offsets = ConsumerOffsets(tmp_path / "config")
    offsets.commit("push", "T", 0, 4)
    offsets.commit("push", "T", 1, 2)  # behind retention
    offsets.commit("push", "T", 2, 0)  # the empty queue
    offsets.commit("push", "U", 0, 9)  # past the end
    offsets.commit("push", "Gone", 0, 1)  # a topic this broker no longer has: not listed
    groups = ConsumerGroups(tmp_path / "store")
    groups.record("pop", "T", 0, next_offset=8, pending=[Pending(6, 1, 1000), Pending(7, 0, 2000)])  # done below 6
    groups.record("pop", "T", 1, next_offset=12)  # every message seen and none pending: done up to the end
    groups.record("pop", "U", 0, next_offset=3, pending=[Pending(1, 2, 500)], acked=[(0, 10), (2, 20)])  # 1 in flight: 1.. owed
    groups.record("pop", "T", 5, next_offset=1)  # a queue this topic does not have: not listed
    rows = progress(queue_ranges(state), offsets, groups)
    assert rows == [
        GroupProgress("pop", "T", 0, 6, 10, 4, "pop"), GroupProgress("pop", "T", 1, 12, 12, 0, "pop"),
        GroupProgress("pop", "U", 0, 1, 3, 2, "pop"),
        GroupProgress("push", "T", 0, 4, 10, 6, "offset"), GroupProgress("push", "T", 1, 2, 12, 7, "offset"),
        GroupProgress("push", "T", 2, 0, 0, 0, "offset"), GroupProgress("push", "U", 0, 9, 3, 0, "offset"),
    ]
    assert [(r.group, r.source) for r in progress(queue_ranges(state, "U"), offsets, groups, group="push")] == [("push", "offset")]
    groups.close()


def test_a_group_with_both_an_offset_and_pop_state_on_a_queue_is_listed_once_per_source(state: SimpleNamespace, tmp_path: Path) -> None:
    offsets = ConsumerOffsets(tmp_path / "config")
    offsets.commit("both", "T", 0, 3)
    groups = ConsumerGroups(tmp_path / "store")
    groups.record("both", "T", 0, next_offset=9)
    assert progress(queue_ranges(state, "T"), offsets, groups) == [
        GroupProgress("both", "T", 0, 3, 10, 7, "offset"), GroupProgress("both", "T", 0, 9, 10, 1, "pop")]
    groups.close()


@pytest.mark.parametrize("call, addr", [("consumer_progress", "10.0.0.1:7000"), ("broker_status", "10.0.0.1:7000"), ("index_status", "10.0.0.1:7001")])
def test_the_admin_clients_broker_calls_take_answers_past_grpcs_4_mib_default(monkeypatch: pytest.MonkeyPatch, call: str, addr: str) -> None:
    """A broker with many queues and groups answers GetConsumerProgress with more than 4 MiB:
    the channel to it takes what the router's channels take."""
    from quarry.clients import admin as admin_module

    opened: list[tuple[str, list[tuple[str, int]]]] = []

    class Opened(Exception):
        pass

    def open_channel(address: str, options: list[tuple[str, int]] | None = None, account: tuple[str, str] | None = None) -> None:
        opened.append((address, list(options or [])))
        raise Opened

    monkeypatch.setattr(admin_module, "open_channel", open_channel)
    client = admin_module.AdminClient("127.0.0.1:1")
    try:
        with pytest.raises(Opened):
            getattr(client, call)(addr)
    finally:
        client.close()
    ((address, options),) = opened
    assert address == addr and dict(options).get("grpc.max_receive_message_length", 4 << 20) >= 128 << 20
