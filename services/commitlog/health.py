"""Whether the commitlog can take writes, from the store's state (the health service's answer).

NOT_SERVING, with the reason, while the disk is full (the last append failed for want of
space and the file system still has less than two largest messages free) or while the
flusher cannot make writes durable (its thread is gone, or its last round failed). A
read-only store serves reads and needs neither.
"""
from __future__ import annotations

import os

from quarry.services.commitlog.storage.store import CommitLogStore


def _free_bytes(path: os.PathLike[str] | str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def store_health(store: CommitLogStore) -> str:
    """"" when the store can take writes, else why not."""
    if store.follower is not None:
        if not store.follower.alive():
            return "follower thread is not running: the writer's new records are not picked up"
        return f"following failed: {store.follower.failing}" if store.follower.failing else ""
    if store.read_only:
        return ""
    if store.disk_full:
        try:
            roomy = _free_bytes(store.dir) >= 2 * store.config.max_message_size
        except OSError:
            roomy = False
        if not roomy:
            return f"disk full: {store.disk_full}"
    if not store.flusher.alive():
        return "flusher thread is not running: nothing written becomes durable"
    if store.flusher.failing:
        return f"flusher failing: {store.flusher.failing}"
    return ""
