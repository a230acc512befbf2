"""Retention: segments older than the reserved time are deleted, oldest first."""
from __future__ import annotations

import logging
import os
import time

from quarry.services.commitlog.storage.store_state import StoreState
from quarry.services.log import log_event
from quarry.services.progress import Progress

log = logging.getLogger("quarry.store")


def delete_expired(state: StoreState, now_s: float | None = None, progress: Progress | None = None) -> int:
    """Delete segments older than the reserved time, oldest first, never the active one.
    `progress` counts segments found expired against segments deleted: one that cannot be
    deleted (its space never comes back) leaves it behind, which says so."""
    if state.read_only:
        return 0
    now_s = now_s if now_s is not None else time.time()
    limit = state.config.file_reserved_hours * 3600
    expired = []
    with state.lock:
        while len(state.segments.segments) > 1:
            oldest = state.segments.segments[0]
            if state.segments.segments[1].start > state.write_offset:
                break
            if now_s - os.path.getmtime(oldest.path) < limit:
                break
            expired.append(state.segments.detach_oldest())
            log_event(log, "segment expired", file=oldest.path.name, min_offset=state.segments.min_offset)
    if progress is not None:
        progress.input(progress.position + len(expired))
    for seg in expired:  # appends go on meanwhile: unlinking a 1 GiB file takes a while
        try:
            state.segments.remove(seg)
        except OSError as exc:
            if progress is not None:
                progress.block(f"segment {seg.path.name} expired but cannot be deleted: {exc}")
            raise
        if progress is not None:
            progress.advanced(progress.position + 1)
    return len(expired)
