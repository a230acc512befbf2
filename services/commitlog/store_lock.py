"""One writer per store directory, as Apache RocketMQ keeps it: the store root's `lock` file,
held with an exclusive POSIX record lock on its first byte (DefaultMessageStore's
`FileChannel.tryLock(0, 1, false)`) for as long as the writer runs. Two writers would append
over each other's acknowledged records: a second Quarry commitlog on the directory finds the
lock taken and does not start, and neither does one on the store of a running RocketMQ broker.
(The other way round the lock comes too late: a RocketMQ broker recovers, and may truncate,
its store before it tries the lock, so it must never be started on a store Quarry writes.)
The kernel drops the lock when its process ends, however it ends. Read-only and following
stores neither take nor create it: they read a writer's store beside it.
"""
from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

LOCK_FILE = "lock"


class StoreLockError(Exception):
    """The store's lock could not be taken (the message names the flag, the file and why)."""


class StoreInUse(StoreLockError):
    """Another process writes this store directory (the message says which and what to do)."""


def lock_store(store_dir: Path) -> int:
    """Take the store's lock; the returned descriptor holds it until closed."""
    path = store_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise StoreLockError(f"--store-dir [env QUARRY_STORE_DIR]: cannot open {path}: {exc.strerror}") from None
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
        os.pwrite(fd, b"lock", 0)  # what RocketMQ writes there
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            raise StoreInUse(
                f"--store-dir [env QUARRY_STORE_DIR]: {store_dir} has another writer (a Quarry commitlog or an Apache RocketMQ "
                f"broker holds {path}); one process writes a store: read it beside its writer with --follow, or with "
                "--read-only") from None
        raise StoreLockError(f"--store-dir [env QUARRY_STORE_DIR]: cannot lock {path}: {exc.strerror}") from None
    return fd
