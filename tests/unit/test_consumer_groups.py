"""The consumer-group pop state on disk: every logged change survives a reopen (as after a
SIGKILL: no close), a torn last line is dropped, compaction keeps the state, and the pop rules
(redelivery, FIFO, delay, filters, max attempts) over a real store."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from quarry.formats import tag_expression
from quarry.formats.properties import SHARDING_KEY, TIMER_DELIVER_MS
from quarry.services.commitlog.broker import consume_status, pop
from quarry.services.commitlog.storage.consumer_groups import ConsumerGroups, Pending
from quarry.services.commitlog.storage.message_input import NewMessage
from quarry.services.commitlog.storage.store import CommitLogStore, StoreConfig


def test_changes_survive_a_reopen_without_close(tmp_path: Path) -> None:
    g = ConsumerGroups(tmp_path)
    g.subscribe("G", "T", "A || B")
    g.record("G", "T", 0, next_offset=5, pending=[Pending(3, 1, 1000, "", 900, 7), Pending(4, 0, 2000)])
    g.record("G", "T", 0, acked=[(3, 1234)])
    g.sync()
    again = ConsumerGroups(tmp_path)  # the first one was never closed
    q = again.queue_view("G", "T", 0)
    assert q.next == 5 and list(q.pending) == [4] and q.acked == {3: 1234} and q.committed() == 4
    assert again.groups_of("T")["G"].expression == "A || B"


def test_a_torn_last_line_is_dropped(tmp_path: Path) -> None:
    g = ConsumerGroups(tmp_path)
    g.record("G", "T", 1, next_offset=2)
    g.sync()
    journal = next((tmp_path / "consumergroups").glob("journal.*"))
    with open(journal, "ab") as fh:
        fh.write(b'{"g":"G","t":"T","q":1,"n":9')  # a crash mid-write: never answered
    again = ConsumerGroups(tmp_path)
    assert again.queue_view("G", "T", 1).next == 2
    assert journal.read_bytes().endswith(b"\n")


def test_compaction_keeps_the_state_and_starts_a_new_journal(tmp_path: Path) -> None:
    g = ConsumerGroups(tmp_path)
    g.record("G", "T", 0, next_offset=3, pending=[Pending(1, 2, 50, "grp", 10, 4)], dead=[(0, 77)])
    g.compact()
    g.record("G", "T", 0, acked=[(2, 88)])
    g.sync()
    names = sorted(p.name for p in (tmp_path / "consumergroups").iterdir())
    assert names == ["journal.1", "state.json"]
    q = ConsumerGroups(tmp_path).queue_view("G", "T", 0)
    assert q.pending[1] == Pending(1, 2, 50, "grp", 10, 4) and q.dead == {0: 77} and q.acked == {2: 88}


@pytest.fixture
def store(tmp_path: Path):  # type: ignore[no-untyped-def]
    s = CommitLogStore(StoreConfig(store_dir=tmp_path / "store", segment_size=1 << 20, flush_mode="SYNC"))
    yield s
    s.close()


def _send(store: CommitLogStore, tag: str = "", props: list[tuple[str, str]] | None = None) -> int:
    r = store.append(NewMessage("T", b"x", [], tag, os.urandom(8).hex(), props or [], 0, 0))
    return r.queue_offset


def test_pop_rules_over_a_real_store(store: CommitLogStore) -> None:
    groups = store.consumer_groups
    everything = tag_expression.parse("*")
    a = _send(store, "A")
    fifo1 = _send(store, props=[(SHARDING_KEY, "g1")])
    fifo2 = _send(store, props=[(SHARDING_KEY, "g1")])
    later = _send(store, props=[(TIMER_DELIVER_MS, "5000")])
    r = pop.pop_queue(store, groups, "G", "T", 0, everything, 16, 1000, 2, now=1000)
    assert [d.record.queue_offset for d in r.deliveries] == [a, fifo1]  # fifo2 waits for fifo1, `later` for 5000
    status = {o: consume_status.statuses(groups, store.consumer_offsets, "T", 0, o, None, 1500, 2)[0].state for o in (a, fifo2, later)}
    assert status == {a: "IN_FLIGHT", fifo2: "NOT_YET_CONSUMED", later: "NOT_YET_CONSUMED"}
    first = r.deliveries[1].pending
    assert pop.ack(groups, "G", "T", pop.Handle(0, fifo1, first.nonce), 1500)
    r = pop.pop_queue(store, groups, "G", "T", 0, everything, 16, 1000, 2, now=2500)  # a is due again
    assert [(d.record.queue_offset, d.pending.attempt) for d in r.deliveries] == [(a, 2), (fifo2, 1)]
    r = pop.pop_queue(store, groups, "G", "T", 0, everything, 16, 1000, 2, now=6000)
    assert [(d.record.queue_offset, d.pending.attempt) for d in r.deliveries] == [(fifo2, 2), (later, 1)]
    assert [rec.queue_offset for rec, _ in r.to_dead_letter] == [a]  # two attempts made: dead-lettered next
    with pytest.raises(pop.HandleError, match="superseded"):
        pop.ack(groups, "G", "T", pop.Handle(0, fifo1 + 1, 0), 6000)


def test_filters_pass_other_tags(store: CommitLogStore) -> None:
    a, b = _send(store, "A"), _send(store, "B")
    r = pop.pop_queue(store, store.consumer_groups, "G", "T", 0, tag_expression.parse("B"), 16, 1000, 3, now=0)
    assert [d.record.queue_offset for d in r.deliveries] == [b]
    store.consumer_groups.subscribe("G", "T", "B")
    (st,) = consume_status.statuses(store.consumer_groups, store.consumer_offsets, "T", 0, a, "A", 0, 3)
    assert st.state == "FILTERED"
