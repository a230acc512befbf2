"""The commitlog's loops say when they stop moving (issue 32, the shape): consumer offset
persistence that cannot write, and retention that cannot delete, report a stall naming why,
and recover; a loop with nothing to do is never stalled."""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from quarry.services.commitlog.storage.message_input import NewMessage
from quarry.services.commitlog.broker.offsets_persister import OffsetsPersister
from quarry.services.commitlog.storage.store import CommitLogStore, StoreConfig
from quarry.services.progress import Progress
from tests.e2e.conftest import wait_until


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_offset_persistence_that_cannot_write_is_stalled_then_recovers(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    store = CommitLogStore(StoreConfig(store_dir=tmp_path / "s", segment_size=64 * 1024))
    clock = Clock()
    persister = OffsetsPersister(store.consumer_offsets, 0.01)
    persister.progress = progress = Progress("consumer offset persistence", "changes", stall_after_s=10, clock=clock)
    config = tmp_path / "s" / "config"
    shutil.rmtree(config, ignore_errors=True)
    config.write_text("not a directory")  # every write of consumerOffset.json fails now
    persister.start()
    try:
        wait_until(lambda: progress.check() == "" and progress.position == 0, what="an idle persister, not stalled")
        store.consumer_offsets.commit("G", "T", 0, 5)
        wait_until(lambda: progress.blocked and progress.input_end == 1, what="the failed write seen")
        clock.now += 11
        reason = progress.check()
        assert "consumer offset persistence stalled" in reason and "consumerOffset.json" in reason and "1 changes behind" in reason
        config.unlink()
        config.mkdir()
        wait_until(lambda: progress.check() == "", what="persisting again")
        assert store.consumer_offsets.persisted == store.consumer_offsets.version == 1
    finally:
        persister.stop()
        store.close()
    events = [r.getMessage() for r in caplog.records if r.name in ("quarry.progress", "quarry.commitlog")]
    assert events.count("stalled") == 1 and events.count("progressing again") == 1
    assert events.count("consumer offsets not persisted; will retry") == 1  # said once, not every round


def test_retention_that_cannot_delete_is_stalled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = CommitLogStore(StoreConfig(store_dir=tmp_path / "s", segment_size=4096, file_reserved_hours=1))
    try:
        for i in range(40):
            store.append(NewMessage(topic="T", body=b"x" * 300, keys=[f"k{i}"]))
        clock = Clock()
        store.retention_progress = progress = Progress("retention", "segments", stall_after_s=10, clock=clock)

        def refuse(path: str) -> None:
            raise PermissionError(1, "Operation not permitted", path)

        monkeypatch.setattr("os.unlink", refuse)
        with pytest.raises(PermissionError):
            store.delete_expired(now_s=10**10)
        clock.now += 11
        reason = progress.check()
        assert "retention stalled" in reason and "cannot be deleted" in reason and "Operation not permitted" in reason
    finally:
        monkeypatch.undo()
        store.close()
