"""The flusher's pacing: a writer waiting on its send is flushed at once, a reader waiting on
the durable end (a tailer, a consumer) no sooner than its gap after the previous flush (the
shortest gap asked for wins); the checkpoint, and with it the queue files' fsync, comes at
most every CHECKPOINT_EVERY_S (one put off is written once the store is idle) and always at a
clean close, and recovery is as exact as before."""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Callable

import pytest

from quarry.services.commitlog.storage import flushing
from quarry.services.commitlog.storage.append import AppendResult
from quarry.services.commitlog.storage.message_input import NewMessage
from quarry.services.commitlog.storage.store import CommitLogStore, StoreConfig
from quarry.services.commitlog.storage.flushing import wait_flushed_blocking


def _open(d: Path, interval_ms: int = 60_000) -> CommitLogStore:
    return CommitLogStore(StoreConfig(store_dir=d, segment_size=1 << 20, flush_interval_ms=interval_ms))


def _msg(i: int) -> NewMessage:
    return NewMessage(topic="T", body=f"body-{i}".encode(), keys=[f"k{i}"])


def _wait(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _checkpoint(d: Path) -> dict[str, object]:
    return json.loads((d / "quarry-checkpoint.json").read_text())  # type: ignore[no-any-return]


def test_a_waiting_writer_is_flushed_at_once_even_while_a_reader_waits_out_its_gap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = _open(tmp_path)
    try:
        store.append(_msg(0))
        store.flush()  # the previous flush the gap counts from
        end = store.append(_msg(1)).physical_offset + 1
        store.request_flush(3600.0)  # a reader alone would wait an hour (the 60 s interval, in fact)
        assert store.state.flushed_offset < end  # the reader's request waits out its gap
        done = threading.Event()
        threading.Thread(target=lambda: done.set() if wait_flushed_blocking(store.flusher, end, 10) else None, daemon=True).start()
        _wait(done.is_set, "the writer's flush")
    finally:
        store.close()


def test_a_reader_is_flushed_no_sooner_than_the_gap_after_the_previous_flush(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    flushed_at: list[float] = []
    store = _open(tmp_path)
    real_flush = store.flusher.flush

    def timed(clean: bool = False) -> int:
        # Taken as each flush begins: the gap counts from a moment inside the previous flush,
        # so starts are at least the gap apart, whatever each flush's own length.
        flushed_at.append(time.monotonic())
        return real_flush(clean)

    # This store's flusher only: other tests' stores may still be flushing in this process.
    monkeypatch.setattr(store.flusher, "flush", timed)
    try:
        end = 0
        for i in range(4):
            end = store.append(_msg(i)).physical_offset + 1
            store.request_flush(0.3)
            _wait(lambda: store.state.flushed_offset >= end, f"reader flush {i}")
        gaps = [b - a for a, b in zip(flushed_at, flushed_at[1:])]
        assert len(gaps) >= 3 and min(gaps) >= 0.3, gaps  # a lower bound: the flusher waited at least this
    finally:
        store.close()


@pytest.mark.parametrize("order", ["long first", "short first"])
def test_the_shortest_gap_asked_for_wins_whenever_it_comes(tmp_path: Path, order: str) -> None:
    """A tailer's long gap does not hold up a consumer that asks for a short one, whether the
    flusher already waits out the long one or not."""
    store = _open(tmp_path)
    try:
        store.append(_msg(0))
        store.flush()
        gaps = [3600.0, flushing.CONSUMER_FLUSH_GAP_S]
        for i in range(3):  # the flusher may be anywhere in its wait when the short one comes
            end = store.append(_msg(i + 1)).physical_offset + 1
            for gap in gaps if order == "long first" else reversed(gaps):
                store.request_flush(gap)
            _wait(lambda: store.state.flushed_offset >= end, f"the consumer's flush {i}")  # well before the 60 s interval
    finally:
        store.close()


def test_a_short_gap_cuts_short_a_long_wait_already_begun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = _open(tmp_path)
    waiting = threading.Event()
    real_wait = store.flusher._requests.wait

    def wait(timeout: float | None = None) -> bool:
        waiting.set()  # the flusher is in its wait, its deadline reckoned
        return real_wait(timeout)

    monkeypatch.setattr(store.flusher._requests, "wait", wait)
    try:
        store.append(_msg(0))
        store.flush()
        end = store.append(_msg(1)).physical_offset + 1
        waiting.clear()
        store.request_flush(3600.0)
        _wait(waiting.is_set, "the flusher waiting out the long gap")
        store.request_flush(flushing.CONSUMER_FLUSH_GAP_S)
        _wait(lambda: store.state.flushed_offset >= end, "the consumer's flush")  # well before the 60 s interval
    finally:
        store.close()


def test_queue_files_are_fsynced_with_a_checkpoint_not_with_every_flush(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flushing, "CHECKPOINT_EVERY_S", 3600.0)
    store = _open(tmp_path)
    dirty = lambda: any(cq.dirty for cq in store.state.cqs.queues.values())  # noqa: E731
    try:
        store.append(_msg(0))
        store.flush()  # the first flush writes a checkpoint: the queue files are synced with it
        assert not dirty()
        store.append(_msg(1))
        store.flush()  # the log is synced, no checkpoint is due: the queue files wait
        assert store.state.flushed_offset == store.state.write_offset and dirty()
        store.flush(clean=True)  # what a clean close writes: a checkpoint, the queue files with it
        assert not dirty()
    finally:
        store.close()


def test_the_checkpoint_is_written_at_most_once_a_period_and_a_put_off_one_once_idle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flushing, "CHECKPOINT_EVERY_S", 3600.0)
    writes: list[int] = []
    real_save = flushing.save_checkpoint

    def counted(store_dir: Path, checkpoint: flushing.StoreCheckpoint) -> None:
        if store_dir == tmp_path:  # this store's: other tests' stores may still be flushing
            writes.append(checkpoint.flushed_offset)
        real_save(store_dir, checkpoint)

    monkeypatch.setattr(flushing, "save_checkpoint", counted)
    store = _open(tmp_path, interval_ms=20)
    try:
        results = []
        for i in range(20):
            results.append(store.append(_msg(i)))
            store.flush()
        assert len(writes) == 1  # the first flush's, then none for an hour
        assert _checkpoint(tmp_path)["flushed_offset"] < results[-1].physical_offset
        # Once the period is over, the idle flusher (every 20 ms here) writes the one put off.
        monkeypatch.setattr(flushing, "CHECKPOINT_EVERY_S", 0.0)
        end = results[-1].physical_offset + results[-1].size
        _wait(lambda: _checkpoint(tmp_path)["flushed_offset"] == end, "the put-off checkpoint")
        count = len(writes)
        store.flush()
        store.flush()
        assert len(writes) == count  # nothing new: not written again
    finally:
        store.close()
    assert _checkpoint(tmp_path) == {"flushed_offset": end, "timestamp": _checkpoint(tmp_path)["timestamp"], "clean": True}


def _flushed_then_crashed(d: Path, count: int) -> tuple[list[AppendResult], int]:
    """`count` messages, each flushed (only the first flush writes a checkpoint: the period is
    an hour), then a crash: no clean close, no last checkpoint. Returns them and the checkpoint's offset."""
    store = _open(d)
    results = []
    for i in range(count):
        results.append(store.append(_msg(i)))
        store.flush()
    checkpointed = _checkpoint(d)["flushed_offset"]
    assert isinstance(checkpointed, int) and checkpointed < results[-1].physical_offset
    store.flusher.stop()
    for seg in store.segments.segments:
        os.close(seg.fd)
    for cq in store.state.cqs.queues.values():
        for fd in cq.fds.values():
            os.close(fd)
    return results, checkpointed


def test_a_crash_after_a_put_off_checkpoint_loses_nothing_that_was_flushed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flushing, "CHECKPOINT_EVERY_S", 3600.0)
    results, _ = _flushed_then_crashed(tmp_path, 200)
    again = _open(tmp_path)
    try:
        assert again.state.write_offset == results[-1].physical_offset + results[-1].size
        assert [again.read(r.physical_offset).keys for r in results] == [[f"k{i}"] for i in range(200)]
    finally:
        again.close()


def test_queue_units_a_crash_kept_off_the_disk_are_written_again_by_recovery(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What fsyncing queue files only with a checkpoint relies on (recovery's, not new): the
    units after the checkpoint that never reached the disk are rebuilt from the log."""
    monkeypatch.setattr(flushing, "CHECKPOINT_EVERY_S", 3600.0)
    results, checkpointed = _flushed_then_crashed(tmp_path, 60)
    lost = [r for r in results if r.physical_offset >= checkpointed]
    assert lost
    for r in lost:  # their units never left the page cache
        (queue_file,) = (tmp_path / "consumequeue" / r.topic / str(r.queue_id)).iterdir()
        with open(queue_file, "r+b") as f:
            f.seek(r.queue_offset * 20)
            f.write(bytes(20))
    again = _open(tmp_path)
    try:
        by_queue: dict[int, list[int]] = {}
        for r in results:
            by_queue.setdefault(r.queue_id, []).append(r.physical_offset)
        for queue_id, offsets in by_queue.items():
            records, _, _, _ = again.pull("T", queue_id, 0, 1000)
            assert [rec.physical_offset for rec in records] == offsets
    finally:
        again.close()
