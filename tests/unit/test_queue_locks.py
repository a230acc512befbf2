"""Orderly consumers' queue locks (services/commitlog/broker/queue_locks.py): RocketMQ's
RebalanceLockManager rules, with a clock the test moves."""
from __future__ import annotations

from quarry.services.commitlog.broker.queue_locks import MAX_LIVE_MS, QueueLocks

Q0, Q1, Q2 = ("T", "broker-a", 0), ("T", "broker-a", 1), ("T", "broker-b", 0)


def locks() -> tuple[QueueLocks, list[int]]:
    now = [1_000]
    return QueueLocks(clock_ms=lambda: now[0]), now


def test_a_free_queue_is_locked_by_the_first_client_and_refused_to_others() -> None:
    table, _ = locks()
    assert table.try_lock("G", [Q0, Q1], "c1") == {Q0, Q1}
    assert table.try_lock("G", [Q1, Q2], "c2") == {Q2}  # Q1 is c1's: left out, not an error
    assert (table.holder("G", Q0), table.holder("G", Q1), table.holder("G", Q2)) == ("c1", "c1", "c2")
    assert table.try_lock("G", [Q0], "c1") == {Q0}  # the holder locking again: renewed
    assert table.held("G") == {Q0: "c1", Q1: "c1", Q2: "c2"}


def test_groups_are_separate() -> None:
    table, _ = locks()
    assert table.try_lock("G1", [Q0], "c1") == {Q0}
    assert table.try_lock("G2", [Q0], "c2") == {Q0}
    assert (table.holder("G1", Q0), table.holder("G2", Q0)) == ("c1", "c2")


def test_a_lock_lives_60_seconds_past_its_last_renewal_then_anyone_takes_it() -> None:
    table, now = locks()
    assert MAX_LIVE_MS == 60_000
    table.try_lock("G", [Q0], "c1")
    now[0] += 40_000
    assert table.try_lock("G", [Q0], "c1") == {Q0}  # renewed at 41 s
    now[0] += MAX_LIVE_MS  # exactly the live time: still held (expired only past it)
    assert table.try_lock("G", [Q0], "c2") == set() and table.holder("G", Q0) == "c1"
    now[0] += 1
    assert table.holder("G", Q0) is None
    assert table.try_lock("G", [Q0], "c2") == {Q0} and table.holder("G", Q0) == "c2"


def test_only_the_holder_unlocks() -> None:
    table, _ = locks()
    table.try_lock("G", [Q0, Q1], "c1")
    assert table.unlock("G", [Q0, Q1, Q2], "c2") == set()  # not c2's: left alone
    assert table.unlock("G", [Q0, Q2], "c1") == {Q0}
    assert table.held("G") == {Q1: "c1"}
    assert table.try_lock("G", [Q0], "c2") == {Q0}
    assert table.unlock("nobody", [Q0], "c1") == set()


def test_expired_locks_are_forgotten_on_request() -> None:
    table, now = locks()
    table.try_lock("G", [Q0], "c1")
    table.try_lock("H", [Q1], "c1")
    now[0] += 30_000
    table.try_lock("H", [Q1], "c1")
    now[0] += MAX_LIVE_MS - 10_000
    assert table.forget_expired() == 1
    assert table.held("G") == {} and table.held("H") == {Q1: "c1"}


def test_lock_requests_drop_expired_locks_once_a_lifetime() -> None:
    """Groups and queues nobody locks any more do not stay in the table: a lock request past a
    lock's lifetime since the last sweep drops every expired one."""
    table, now = locks()
    table.try_lock("Gone", [Q0, Q1], "c1")
    now[0] += MAX_LIVE_MS // 2
    table.try_lock("G", [Q2], "c2")
    assert "Gone" in table._groups  # (not a lifetime yet)
    now[0] += MAX_LIVE_MS // 2 + 1
    table.try_lock("G", [Q2], "c2")
    assert "Gone" not in table._groups and table.held("G") == {Q2: "c2"}
