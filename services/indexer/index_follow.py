"""Answer from a RocketMQ broker's own `index/` while the broker writes it (--follow-index).

RocketMQ's IndexFiles are byte-compatible with Quarry's (formats/index_file.py), so instead
of keeping a second copy the indexer maps the broker's files read-only and, every interval,
reads their headers again (the broker's puts move indexCount and the end offsets), opens the
files the broker creates once they have their full size and a sound header, and lets go of
the files it deletes. Nothing in the directory is written, locked or created.
"""
from __future__ import annotations

import logging
import threading

from quarry.formats.index_file import IndexFile, IndexFileError, file_size
from quarry.formats.index_keys import INDEX_FILE_NAME
from quarry.services.indexer.index_store import IndexStore
from quarry.services.log import FailureReport, log_event

log = logging.getLogger("quarry.index.follow")


def refresh(index: IndexStore) -> bool:
    """One round (the caller holds the indexer's lock); returns whether a file came or went."""
    changed = False
    directory, config = index.directory, index.config
    names = {p.name for p in directory.iterdir() if INDEX_FILE_NAME.match(p.name)} if directory.is_dir() else set()
    for f in list(index.files):
        if f.path.name not in names:
            index.detach(f)
            f.close()
            changed = True
            log_event(log, "index file deleted by the broker", file=f.path.name)
    newest = index.files[-1].path.name if index.files else ""
    expected = file_size(config.hash_slot_num, config.index_num)
    for name in sorted(n for n in names if n > newest):
        path = directory / name
        try:
            if path.stat().st_size != expected:
                break  # still being created (or sized for other settings): looked at again next round
            f = IndexFile(path, config.hash_slot_num, config.index_num, read_only=True, create=False)
        except (IndexFileError, OSError):
            break
        index.attach(f)
        changed = True
        log_event(log, "index file picked up", file=name)
    for f in index.files:
        f.reload_header()
        index.sync(f)  # the broker's new entries become visible to queries here, and only here
        if f.entries:
            index.last_update_phy_offset = max(index.last_update_phy_offset, f.header.end_phy_offset)
            index.last_update_timestamp = max(index.last_update_timestamp, f.header.end_timestamp)
    return changed


class IndexFollower:
    """A daemon thread calling `refresh` every interval under the indexer's lock."""

    def __init__(self, index: IndexStore, lock: threading.Lock, interval_ms: int) -> None:
        self.index = index
        self.lock = lock
        self.interval_s = interval_ms / 1000.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="index-follower", daemon=True)
        self._rounds = FailureReport(log, "following the broker's index failed; retrying", "following the broker's index recovered")

    def start(self) -> "IndexFollower":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._rounds.run(self._refresh)  # the thread lives on: the broker's files keep changing

    def _refresh(self) -> None:
        with self.lock:
            refresh(self.index)

    @property
    def failing(self) -> str:
        """The error of the last round, "" once one succeeds."""
        return self._rounds.failing

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
