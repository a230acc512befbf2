"""Builds the key filter's columns (key_filter.py) for sealed IndexFiles, in the background.

On open every file is unfiltered and a query walks them all, as before the filter; this
thread then builds one column per sealed file, newest first, and a query uses a file's
column from the moment it is published. The index's lock is held only to pick a file and
reserve its column, and to publish it: reading a file's entries (through a descriptor of
its own) and setting its bits happen outside it, so the indexer serves and indexes while
hundreds of 400 MB files are summarised.
"""
from __future__ import annotations

import contextlib
import logging
import threading
from typing import ContextManager

from quarry.formats.index_file import IndexFile, IndexFileError
from quarry.services.indexer.index_store import IndexStore
from quarry.services.log import log_event

log = logging.getLogger("quarry.index.filter")


def _build_one(index: IndexStore, f: IndexFile, lock: ContextManager[object]) -> bool:
    with lock:
        if f not in index.unfiltered or not index.sealed(f):
            return False
        col, entries = index.key_filter.reserve(), f.entries
    try:
        index.key_filter.build(col, f.key_hash_chunks(1, entries + 1))
    except (IndexFileError, OSError, ValueError) as exc:
        with lock:
            index.key_filter.release(col)
            if f in index.unfiltered:  # still held: walked on every query from now on
                index.filter_refused.add(f)
                log_event(log, "key filter not built; the file is walked on every query", logging.WARNING, file=f.path.name, error=str(exc))
        return False
    with lock:
        # Gone (dropped, expired, closed) or written since: drop the column; a file still
        # held and sealed is picked again.
        if f not in index.unfiltered or f.entries != entries:
            index.key_filter.release(col)
            return False
        index.unfiltered.remove(f)
        index.filtered[f] = (col, entries)
        index.key_filter.publish(col, f, index.seq(f))
    return True


def build_pending(index: IndexStore, lock: "threading.Lock | None" = None, stop: threading.Event | None = None) -> int:
    """Build the column of every sealed file lacking one (newest first); how many were built.
    With `lock`, the index's lock is held only to pick a file and to publish its column;
    without, the caller owns the store (tests, benchmarks, offline tools)."""
    guard: ContextManager[object] = lock if lock is not None else contextlib.nullcontext()
    built = 0
    while stop is None or not stop.is_set():
        with guard:
            index.filters_wanted.clear()  # set again by whatever seals a file from here on
            pending = index.filter_pending()
        if not pending:
            break
        built += _build_one(index, pending[0], guard)
    return built


class FilterBuilder:
    """A daemon thread running `build_pending` whenever the index wants a filter."""

    def __init__(self, index: IndexStore, lock: threading.Lock) -> None:
        self.index = index
        self.lock = lock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="key-filter-builder", daemon=True)

    def start(self) -> "FilterBuilder":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.index.filters_wanted.wait()
            if self._stop.is_set():
                return
            try:
                built = build_pending(self.index, self.lock, self._stop)
                if built:
                    log_event(log, "key filters built", files=built, bytes=self.index.key_filter.memory_bytes())
            except Exception as exc:  # the thread must live on; queries walk what is unfiltered
                log_event(log, "building key filters failed; retrying", logging.ERROR, error=repr(exc))
                self._stop.wait(1.0)

    def stop(self) -> None:
        self._stop.set()
        self.index.filters_wanted.set()
        self._thread.join(timeout=30)
