"""A read-only view of an indexer's IndexFiles, for another process on the same host.

The commitlog answers RocketMQ 4's QUERY_MESSAGE from it (commitlog --index-dir) instead of
asking its indexer over gRPC: the files are mapped read-only and looked at again every
interval exactly as --follow-index follows a RocketMQ broker's index (index_follow.refresh,
which the indexer's own puts satisfy: each batch's header is written into the shared mapping),
with the key filters built in the background (filter_builder.py). Nothing in the directory is
written, locked or created.

Each query first reads the header of the newest file again (and runs a whole round when that
file is full: the indexer has moved on), so an entry the indexer wrote is seen by the next
query; the rounds pick up deleted files and build filters.

`query` raises Unavailable whenever the view may answer less than the indexer would (the
directory not there yet or unreadable, a refresh failing, a newer file it cannot open, such as
one sized for other --hash-slots/--index-num): the caller then asks the indexer.
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from quarry.formats import scheduled
from quarry.formats.index_keys import INDEX_FILE_NAME
from quarry.services.errors import InvalidArgument, Unavailable, checked_topic
from quarry.services.indexer.filter_builder import FilterBuilder
from quarry.services.indexer.index_follow import IndexFollower, refresh
from quarry.services.indexer.index_store import IndexStore, IndexStoreConfig
from quarry.services.log import log_event

log = logging.getLogger("quarry.index.view")

MAX_KEY_BYTES = 4096
DEFAULT_MAX_NUM = 64
UNIQUE_KEY_DEFAULT_MAX_NUM = 32  # the RocketMQ broker's default for unique-key queries


def query_offsets(index: IndexStore, topic: str, key: str, max_num: int, begin: int, end: int, unique: bool,
                  below: int | None = None) -> tuple[list[int], int]:
    """The indexer's key query rule, for its door and for the view (the caller holds the
    index's lock): the request checked (InvalidArgument), max_num 0 the default of its kind,
    capped at --max-msgs-num-batch, the topic and its parking topics (delayed messages are
    indexed under those before delivery). Returns (offsets newest first, next_below)."""
    checked_topic(topic)
    if not key:
        raise InvalidArgument("key: must not be empty")
    if len(key.encode()) > MAX_KEY_BYTES:
        raise InvalidArgument(f"key: at most {MAX_KEY_BYTES} bytes")
    if max_num < 0:
        raise InvalidArgument("max_num: must be >= 0 (0 means the default)")
    if begin < 0:
        raise InvalidArgument("begin_timestamp: must be >= 0")
    if begin > end:
        raise InvalidArgument(f"begin_timestamp: must be <= end_timestamp ({end})")
    max_num = max_num or (UNIQUE_KEY_DEFAULT_MAX_NUM if unique else DEFAULT_MAX_NUM)
    return index.query_topics_page(scheduled.index_topics(topic), key, max_num, begin, end, below)


REFRESH_INTERVAL_MS = 100  # the rounds' interval (new entries are seen at once: IndexView._catch_up)
_REPORT_AFTER_S = 1.0


class _ViewFollower(IndexFollower):
    """IndexFollower's thread running the view's round."""

    def __init__(self, view: "IndexView") -> None:
        super().__init__(view.index, view.lock, view.interval_ms)
        self.view = view

    def _refresh(self) -> None:
        with self.lock:
            self.view.refresh_locked()


class IndexView:
    """An indexer's `index/` (under its --index-dir) mapped read-only, refreshed every
    `interval_ms` by a daemon thread, its key filters built by another. Thread-safe."""

    def __init__(self, index_dir: Path, hash_slots: int, index_num: int, max_msgs_num_batch: int, interval_ms: int = REFRESH_INTERVAL_MS) -> None:
        self.index_dir = Path(index_dir)
        self.interval_ms = interval_ms
        self.lock = threading.Lock()
        config = IndexStoreConfig(hash_slot_num=hash_slots, index_num=index_num, max_msgs_num_batch=max_msgs_num_batch, read_only=True)
        if self.index_dir.exists() and not self.index_dir.is_dir():
            raise OSError(f"{self.index_dir} is not a directory")
        # (A directory not there yet is the indexer's to make: a commitlog usually starts first.)
        self.index = IndexStore.open(self.index_dir / "index", config)  # read-only: nothing made, moved or locked
        if self.index.problems:
            self.index.close()
            raise OSError("; ".join(self.index.problems))
        self._unreadable = ""  # a newer file the last round could not open
        self._missing = ""  # the directory, not there (yet) at the last round
        self._behind_since: float | None = None
        self._behind_said = False
        self.builder = FilterBuilder(self.index, self.lock)
        self.follower = _ViewFollower(self)

    def start(self) -> "IndexView":
        with self.lock:
            self.refresh_locked()
        self.builder.start()
        self.follower.start()
        return self

    def refresh_locked(self) -> None:
        """One round (the caller holds `lock`): follow the files, then note a newer file the
        round could not open, during which queries go to the indexer."""
        files = self.index.directory  # (the indexer makes <index-dir>/index/ when it opens its store)
        self._missing = "" if files.is_dir() else f"{files} does not exist (yet): the indexer makes it when it starts"
        refresh(self.index)
        directory = self.index.directory
        newest = self.index.files[-1].path.name if self.index.files else ""
        names = sorted(p.name for p in directory.iterdir() if INDEX_FILE_NAME.match(p.name)) if directory.is_dir() else []
        left = [n for n in names if n > newest]
        self._unreadable = f"index file {left[0]} not opened (being created, or sized for other --index-hash-slots/--index-num)" if left else ""
        if not left:
            self._behind_since = None
        elif self._behind_since is None:
            self._behind_since = time.monotonic()
        elif not self._behind_said and time.monotonic() - self._behind_since > _REPORT_AFTER_S:  # not a file caught being created
            log_event(log, "index view behind; key queries ask the indexer", logging.WARNING, reason=self._unreadable)
            self._behind_said = True

    def unavailable(self) -> str:
        """Why the view may answer less than the indexer ("" when it answers as it)."""
        return self._missing or self._unreadable or (f"refreshing the index view failed: {self.follower.failing}" if self.follower.failing else "")

    def query(self, topic: str, key: str, max_num: int, begin: int, end: int, unique: bool = False) -> list[int]:
        """Offsets under topic/key (a unique key with `unique`) whose entries may hold a store
        time in [begin, end], newest first, capped as the indexer caps them; the caller reads
        each record and applies formats.index_keys.answers_key and the exact window."""
        return self.answer(topic, key, max_num, begin, end, unique)[0]

    def answer(self, topic: str, key: str, max_num: int, begin: int, end: int, unique: bool = False) -> tuple[list[int], int, int]:
        """query's offsets, with the store time and physical offset of the last entry the view
        holds (last_update's), read under one hold of the lock."""
        with self.lock:
            self._catch_up()
            why = self.unavailable()
            if why:
                raise Unavailable(why)
            index = self.index
            return query_offsets(index, topic, key, max_num, begin, end, unique)[0], index.last_update_timestamp, index.last_update_phy_offset

    def _catch_up(self) -> None:
        """Before each query: the header of the file being written read again (one unpack), so
        what the indexer has written is seen at once, not at the next round; a full newest file
        means the indexer has moved to a new one, so the whole round runs now."""
        files = self.index.files
        if not files:
            self.refresh_locked()  # (the indexer's first file, as soon as it is there)
            return
        f = files[-1]
        f.reload_header()
        self.index.sync(f)
        if f.is_write_full():
            self.refresh_locked()
        elif f.entries:
            self.index.last_update_phy_offset = max(self.index.last_update_phy_offset, f.header.end_phy_offset)
            self.index.last_update_timestamp = max(self.index.last_update_timestamp, f.header.end_timestamp)

    def last_update(self) -> tuple[int, int]:
        """(store time, physical offset) of the last entry the view holds."""
        with self.lock:
            return self.index.last_update_timestamp, self.index.last_update_phy_offset

    def stop(self) -> None:
        self.follower.stop()
        self.builder.stop()
        with self.lock:
            self.index.close()


def open_index_view(index_dir: str, hash_slots: int, index_num: int, max_msgs_num_batch: int, interval_ms: int = REFRESH_INTERVAL_MS) -> IndexView | None:
    """The started view of `index_dir`, or None (said once in the log) when it cannot be read
    here: key queries then ask the indexer."""
    if not index_dir:
        return None
    try:
        return IndexView(Path(index_dir), hash_slots, index_num, max_msgs_num_batch, interval_ms).start()
    except (OSError, ValueError) as exc:
        log_event(log, "index files not readable here; key queries ask the indexer", logging.WARNING, index_dir=index_dir, reason=str(exc))
        return None
