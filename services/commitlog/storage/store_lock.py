"""One writer per store directory, as Apache RocketMQ keeps it: the store root's `lock` file
(formats/dir_lock.py) for as long as the writer runs. Two writers would append over each
other's acknowledged records: a second Quarry commitlog on the directory finds the lock taken
and does not start, and neither does one on the store of a running RocketMQ broker. (The
other way round the lock comes too late: a RocketMQ broker recovers, and may truncate, its
store before it tries the lock, so it must never be started on a store Quarry writes.)
Read-only and following stores neither take nor create it: they read a writer's store beside it.
"""
from __future__ import annotations

from pathlib import Path

from quarry.formats.dir_lock import LOCK_FILE, DirInUse, DirLockError, lock_dir

__all__ = ["LOCK_FILE", "StoreInUse", "StoreLockError", "lock_store"]

StoreLockError = DirLockError
StoreInUse = DirInUse


def lock_store(store_dir: Path) -> int:
    """Take the store's lock; the returned descriptor holds it until closed."""
    return lock_dir(store_dir, "--store-dir [env QUARRY_STORE_DIR]", "a Quarry commitlog or an Apache RocketMQ broker",
                    "one process writes a store: read it beside its writer with --follow, or with --read-only")
