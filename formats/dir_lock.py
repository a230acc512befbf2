"""One writer per directory: a `lock` file in it, held with an exclusive POSIX record lock on
its first byte for as long as the writer runs, as Apache RocketMQ's broker holds its store
root's (`FileChannel.tryLock(0, 1, false)`). The kernel drops the lock when its process ends,
however it ends. The commitlog's store takes `lock` (services/commitlog/storage/store_lock.py), an
index directory `quarry-index.lock` (formats/index_checkpoint.py: an indexer may share its
commitlog's directory); readers beside a writer take nothing.
"""
from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

LOCK_FILE = "lock"


class DirLockError(Exception):
    """The directory's lock could not be taken (the message names the flag, the file and why)."""


class DirInUse(DirLockError):
    """Another process writes this directory (the message says which and what to do)."""


def lock_dir(directory: Path, flag: str, holders: str, remedy: str, name: str = LOCK_FILE) -> int:
    """Take `directory`'s lock (the file `name`); the returned descriptor holds it until closed.
    `flag` names the setting (`--store-dir [env QUARRY_STORE_DIR]`), `holders` who may hold it,
    `remedy` what to do instead: the refusal is one line an operator can act on."""
    path = directory / name
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise DirLockError(f"{flag}: cannot open {path}: {exc.strerror}") from None
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
        os.pwrite(fd, b"lock", 0)  # what RocketMQ writes there
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            raise DirInUse(f"{flag}: {directory} has another writer ({holders} holds {path}); {remedy}") from None
        raise DirLockError(f"{flag}: cannot lock {path}: {exc.strerror}") from None
    return fd
