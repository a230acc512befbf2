"""The append's dispatchers (services/commitlog/storage/dispatchers.py, dispatch_cache.py) and its
rollback when what follows the write fails."""
from __future__ import annotations

from pathlib import Path

import pytest

from quarry.formats.dispatch import DispatchInfo
from quarry.formats.record import SYSFLAG_TRANSACTION_PREPARED
from quarry.services.commitlog.storage import append
from quarry.services.commitlog.storage.consume_queue_store import ConsumeQueueStore
from quarry.services.commitlog.storage.dispatch_cache import DispatchCache
from quarry.services.commitlog.storage.dispatchers import ConsumeQueueDispatcher
from quarry.services.commitlog.storage.message_input import NewMessage
from quarry.services.commitlog.storage.store import CommitLogStore, StoreConfig


def _row(at: int, queue: int, queue_offset: int, sys_flag: int = 0) -> tuple:  # type: ignore[type-arg]
    return (at, 100, "T", queue, queue_offset, 7, "", None, 0, sys_flag, 0)


def test_queue_units_are_written_per_run_and_gaps_start_a_new_run(tmp_path: Path) -> None:
    cqs = ConsumeQueueStore(tmp_path, 1000, read_only=False, in_memory=True)
    rows = [_row(0, 0, 0), _row(100, 1, 0), _row(200, 0, 1), _row(300, 0, 5), _row(400, 1, 1),
            _row(500, 1, 9, sys_flag=SYSFLAG_TRANSACTION_PREPARED)]  # takes no unit
    ConsumeQueueDispatcher(cqs).dispatch(rows + [DispatchInfo(*_row(600, 0, 6))])
    assert [u[0] for u in cqs.queue("T", 0).read_units(0, 10)] == [0, 200]  # a hole at 2..4
    assert [u[0] for u in cqs.queue("T", 0).read_units(5, 10)] == [300, 600]
    assert [u[0] for u in cqs.queue("T", 1).read_units(0, 10)] == [100, 400]


def test_the_tail_cache_drops_rows_placed_again_at_their_offset() -> None:
    cache = DispatchCache(100)
    cache.dispatch([_row(0, 0, 0), _row(100, 0, 1), _row(200, 0, 2)])
    cache.dispatch([_row(100, 1, 0)])  # an append that failed after the cache had its rows
    got = cache.get(0, 10, 1000)
    assert got is not None and [(i.physical_offset, i.queue_id) for i in got[0]] == [(0, 0), (100, 1)]


def test_a_topic_table_that_fails_to_save_stores_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = CommitLogStore(StoreConfig(store_dir=tmp_path, segment_size=1 << 20))
    try:
        store.append(NewMessage(topic="Old", body=b"a"))

        def full(*_args: object) -> None:
            raise OSError(28, "No space left on device")
        monkeypatch.setattr(append, "save_topics", full)
        with pytest.raises(Exception, match="no space left"):
            store.append_many([NewMessage(topic="Old", body=b"b"), NewMessage(topic="New", body=b"c")], same_topic=False)
        assert "New" not in store.topics
        assert all((cq := store.cqs.existing("New", q)) is None or cq.max_offset == 0 for q in range(4))
        assert sum(store.cqs.queue("Old", q).max_offset for q in range(4)) == 1
        monkeypatch.undo()
        r = store.append(NewMessage(topic="New", body=b"d"))
        assert store.read(r.physical_offset).body == b"d" and store.topics["New"] == 4
    finally:
        store.close()
