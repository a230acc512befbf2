"""Positions kept in the store's queues after recovery cut the log below them (issue 32, 1):
consumer offsets and consumer groups' pop cursors past a queue's new end are brought back to it,
each reported once; positions within the queues are left alone."""
from __future__ import annotations

from pathlib import Path

from quarry.services.commitlog.storage.consumer_groups import Pending
from quarry.services.commitlog.storage.message_input import NewMessage
from quarry.services.commitlog.storage.store import CommitLogStore, StoreConfig


def _open(d: Path) -> CommitLogStore:
    return CommitLogStore(StoreConfig(store_dir=d, segment_size=64 * 1024, default_queues=1))


def test_positions_past_a_repaired_end_are_brought_back_and_reported(tmp_path: Path) -> None:
    store = _open(tmp_path)
    sent = [store.append(NewMessage(topic="T", body=b"x" * 50, keys=[f"k{i}"], queue_id=0)) for i in range(30)]
    store.flush()
    store.consumer_offsets.commit("G-behind", "T", 0, 12)  # within what survives: left alone
    store.consumer_offsets.commit("G-ahead", "T", 0, 30)
    groups = store.consumer_groups
    groups.record("P", "T", 0, next_offset=28, pending=[Pending(25, 1, 0), Pending(19, 1, 0)], acked=[(21, 1)])
    groups.sync()
    store.close()
    with open(tmp_path / "commitlog" / f"{0:020d}", "r+b") as fh:  # a hand repair: cut inside record 20
        fh.truncate(sent[20].physical_offset + 10)

    again = _open(tmp_path)
    try:
        assert again.cqs.existing("T", 0).max_offset == 20  # type: ignore[union-attr]
        assert again.consumer_offsets.get("G-ahead", "T", 0) == 20
        assert again.consumer_offsets.get("G-behind", "T", 0) == 12
        q = again.consumer_groups.queue_view("P", "T", 0)
        assert q.next == 20 and set(q.pending) == {19} and 21 not in q.acked
        problems = again.state.problems
        assert len(problems) == 2, problems
        assert "G-ahead" in problems[0] and "was 30" in problems[0] and "set to 20" in problems[0]
        assert "P's pop cursor" in problems[1] and "1 messages in flight" in problems[1]
    finally:
        again.close()
    # Persisted: the next start finds nothing to bring back, and says nothing.
    third = _open(tmp_path)
    try:
        assert third.consumer_offsets.get("G-ahead", "T", 0) == 20 and third.consumer_groups.queue_view("P", "T", 0).next == 20
        assert third.state.problems == []
    finally:
        third.close()
