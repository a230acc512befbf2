"""One writer per store directory (services/commitlog/storage/store_lock.py): the store root's `lock`
file with an exclusive POSIX record lock on its first byte, as an Apache RocketMQ broker holds
it. Another process stands in for the broker: it locks the file as DefaultMessageStore does."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from quarry.services.commitlog.storage.store import CommitLogStore, StoreConfig
from quarry.formats.index_checkpoint import LOCK_NAME as INDEX_LOCK
from quarry.formats.index_checkpoint import lock_index_dir
from quarry.services.commitlog.storage.segments import StoreLayoutError
from quarry.services.commitlog.storage.store_lock import LOCK_FILE, StoreInUse

_HOLD = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)  # FileChannel.tryLock(0, 1, false)
print("locked", flush=True)
sys.stdin.read()  # until the test closes our stdin
"""
_TRY = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
try:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
except OSError:
    print("taken")
else:
    print("free")
"""


def _other_process_sees(lock: Path) -> str:
    return subprocess.run([sys.executable, "-c", _TRY, str(lock)], capture_output=True, text=True, timeout=30, check=True).stdout.strip()


@pytest.fixture
def broker_holding(tmp_path: Path) -> Iterator[Path]:
    """A store directory whose lock another process (the 'broker') holds while the test runs."""
    store = tmp_path / "store"
    store.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(store / LOCK_FILE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        yield store
    finally:
        assert holder.stdin is not None and holder.stdout is not None
        holder.stdin.close()
        holder.wait(30)
        holder.stdout.close()


def test_a_store_another_process_writes_is_refused_and_left_as_it_was(broker_holding: Path) -> None:
    with pytest.raises(StoreInUse) as refused:
        CommitLogStore(StoreConfig(store_dir=broker_holding))
    assert "--store-dir [env QUARRY_STORE_DIR]" in str(refused.value) and "another writer" in str(refused.value)
    assert sorted(p.name for p in broker_holding.iterdir()) == [LOCK_FILE]  # nothing made in it


def test_a_writing_store_holds_the_lock_a_broker_would_take_until_it_closes(tmp_path: Path) -> None:
    store = CommitLogStore(StoreConfig(store_dir=tmp_path / "store"))
    try:
        store.append_many([_message()])
        assert _other_process_sees(tmp_path / "store" / LOCK_FILE) == "taken"
        # Reading beside the writer takes nothing: read-only and following stores open.
        for config in (StoreConfig(store_dir=tmp_path / "store", read_only=True), StoreConfig(store_dir=tmp_path / "store", follow=True)):
            reader = CommitLogStore(config)
            reader.close()
        assert _other_process_sees(tmp_path / "store" / LOCK_FILE) == "taken"
    finally:
        store.close()
    assert _other_process_sees(tmp_path / "store" / LOCK_FILE) == "free"
    reopened = CommitLogStore(StoreConfig(store_dir=tmp_path / "store"))  # the next writer
    try:
        assert reopened.write_offset > 0
    finally:
        reopened.close()


def test_a_store_that_does_not_open_gives_its_lock_back(tmp_path: Path) -> None:
    """Refused (here a segment named off the segment size): the lock is free for the next try,
    also in a process that goes on (one that embeds the store)."""
    from quarry.services.commitlog.storage.segments import StoreLayoutError

    (tmp_path / "store" / "commitlog").mkdir(parents=True)
    (tmp_path / "store" / "commitlog" / f"{1000:020d}").write_bytes(bytes(4096))
    with pytest.raises(StoreLayoutError):
        CommitLogStore(StoreConfig(store_dir=tmp_path / "store", segment_size=4096))
    assert _other_process_sees(tmp_path / "store" / LOCK_FILE) == "free"


def test_a_read_only_store_creates_no_lock_file(tmp_path: Path) -> None:
    writer = CommitLogStore(StoreConfig(store_dir=tmp_path / "store"))
    writer.append_many([_message()])
    writer.close()
    (tmp_path / "store" / LOCK_FILE).unlink()  # as a store copied without it
    reader = CommitLogStore(StoreConfig(store_dir=tmp_path / "store", read_only=True))
    reader.close()
    assert not (tmp_path / "store" / LOCK_FILE).exists()


def _message():  # type: ignore[no-untyped-def]
    from quarry.services.commitlog.storage.message_input import NewMessage
    return NewMessage("LockTopic", b"body", ["k"])


def _rocketmq_store(root: Path) -> Path:
    """A stopped RocketMQ broker's store root as the broker leaves it: commitlog/ with a segment
    and its binary `checkpoint` (physicMsgTimestamp, logicsMsgTimestamp, indexMsgTimestamp: a
    4 KiB page, not JSON)."""
    (root / "commitlog").mkdir(parents=True)
    (root / "commitlog" / "00000000000000000000").write_bytes(bytes(1 << 16))
    (root / "checkpoint").write_bytes((1_764_000_000_000).to_bytes(8, "big") * 3 + bytes(4096 - 24))
    return root


def test_a_stopped_rocketmq_brokers_store_is_not_opened_for_writing(tmp_path: Path) -> None:
    store = _rocketmq_store(tmp_path / "rmq-store")
    before = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}
    with pytest.raises(StoreLayoutError) as refused:
        CommitLogStore(StoreConfig(store_dir=store, segment_size=1 << 16))
    message = str(refused.value)
    assert "--store-dir [env QUARRY_STORE_DIR]" in message and "Apache RocketMQ broker's store" in message and "--read-only true" in message
    assert {p: p.read_bytes() for p in store.rglob("*") if p.is_file()} == before  # nothing made or changed, not even the lock
    reader = CommitLogStore(StoreConfig(store_dir=store, segment_size=1 << 16, read_only=True))  # read beside it: as before
    reader.close()


def test_a_store_quarry_already_writes_beside_a_rocketmq_checkpoint_stays_writable(tmp_path: Path) -> None:
    store = _rocketmq_store(tmp_path / "adopted")
    (store / "commitlog" / "00000000000000000000").unlink()
    (store / "quarry-checkpoint.json").write_text('{"flushed_offset": 0, "timestamp": 0, "clean": true}')
    writer = CommitLogStore(StoreConfig(store_dir=store, segment_size=1 << 16))
    try:
        writer.append_many([_message()])
    finally:
        writer.close()


def test_an_indexer_may_keep_its_index_in_its_commitlogs_directory(tmp_path: Path) -> None:
    # Each takes its own file: the store's `lock`, the index's `quarry-index.lock`.
    store = CommitLogStore(StoreConfig(store_dir=tmp_path / "both"))
    try:
        fd = lock_index_dir(tmp_path / "both", "--index-dir [env QUARRY_INDEX_DIR]")
        try:
            assert _other_process_sees(tmp_path / "both" / LOCK_FILE) == "taken"
            assert _other_process_sees(tmp_path / "both" / INDEX_LOCK) == "taken"
        finally:
            os.close(fd)
        assert _other_process_sees(tmp_path / "both" / INDEX_LOCK) == "free"
    finally:
        store.close()
