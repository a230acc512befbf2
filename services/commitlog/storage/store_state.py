"""What the parts of one broker's store share: settings, files, topics, offsets, the append lock.

The store (`store.py`) is a façade over modules that each do one thing with this state:
`recovery` (open and repair), `append`, `flushing`, `reads` and `retention`.
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from quarry.formats.index_checkpoint import rocketmq_store_checkpoint
from quarry.formats.store_names import STORE_CHECKPOINT as CHECKPOINT_FILE
from quarry.services.commitlog.storage.consume_queue_store import ConsumeQueueStore
from quarry.services.commitlog.storage.dispatch_cache import DispatchCache
from quarry.services.commitlog.storage.followed_queue import FollowedConsumeQueue
from quarry.services.commitlog.storage.segments import SegmentQueue, StoreLayoutError
from quarry.services.commitlog.storage.store_lock import lock_store
from quarry.services.commitlog.storage.topic_table import load_topics
from quarry.services.log import log_event

log = logging.getLogger("quarry.store")

ABORT_FILE = "abort"


@dataclass
class StoreConfig:
    """Every store setting, with RocketMQ-like defaults."""

    store_dir: Path
    store_host: tuple[str, int] = ("127.0.0.1", 10911)
    segment_size: int = 1024 * 1024 * 1024
    cq_units_per_file: int = 300_000
    flush_mode: str = "ASYNC"  # or SYNC
    flush_interval_ms: int = 500
    sync_flush_timeout_ms: int = 5000
    auto_create_topics: bool = True
    default_queues: int = 4
    max_message_size: int = 4 * 1024 * 1024
    file_reserved_hours: float = 72.0
    read_only: bool = False
    dispatch_cache_records: int = 32768  # newest records whose dispatch info Tail serves from memory
    verify_segments: int = 3  # newest segments whose record CRCs recovery checks at every start (RocketMQ: 3)
    follow: bool = False  # another process writes the directory: read-only, followed (services/commitlog/storage/follow.py)
    follow_interval_ms: int = 100


def _refuse_a_rocketmq_store(store_dir: Path) -> None:
    """A stopped RocketMQ broker's store is read (--read-only, --follow), never written: a
    writable open recovers it as Quarry's (truncating a torn tail, rewriting queue units) and
    appends to it. One Quarry already writes (its checkpoint beside RocketMQ's) stays writable."""
    found = rocketmq_store_checkpoint(store_dir)
    if found is not None and not (store_dir / CHECKPOINT_FILE).exists():
        raise StoreLayoutError(
            f"--store-dir [env QUARRY_STORE_DIR]: {store_dir} is an Apache RocketMQ broker's store ({found} is RocketMQ's checkpoint) "
            "and Quarry does not write into it: serve it with --read-only true, or beside its running broker with --follow true; "
            "to make Quarry its writer, give Quarry a directory of its own holding a copy of its commitlog/")


class StoreState:
    """The store's shared state. `lock` serialises appends and every change of the segment
    list; `write_offset` is the end of the log, `flushed_offset` the end of its fsynced prefix."""

    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        self.dir = Path(config.store_dir)
        self.read_only = config.read_only or config.follow
        self.lock_fd: int | None = None  # holds the store's lock while this store writes (store_lock.py)
        if not self.read_only:
            _refuse_a_rocketmq_store(self.dir)
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.lock_fd = lock_store(self.dir)  # before anything in it is changed
            try:
                self._open(config)
            except BaseException:
                self.release_lock()
                raise
            return
        if not (self.dir / "commitlog").is_dir() and not config.follow:  # a followed writer may not have made it yet
            raise FileNotFoundError(f"{self.dir}: no commitlog/ directory to open read-only")
        self._open(config)

    def _open(self, config: StoreConfig) -> None:
        if not self.read_only:
            (self.dir / "commitlog").mkdir(exist_ok=True, mode=0o700)
        self.lock = threading.Lock()
        self.segments = SegmentQueue(self.dir / "commitlog", config.segment_size, self.read_only)
        # A read-only store without consumequeue/ (a dead broker's copied CommitLog): its
        # queues, topics and queue offsets are rebuilt in memory by recovery; nothing is written.
        self.rebuild_in_memory = self.read_only and not config.follow and not (self.dir / "consumequeue").is_dir()
        # Following a writer: its own queue files read-only, what they lack in memory (followed_queue.py).
        follow_queue = (lambda d: FollowedConsumeQueue(d, config.cq_units_per_file)) if config.follow else None
        self.cqs = ConsumeQueueStore(self.dir / "consumequeue", config.cq_units_per_file, self.read_only, in_memory=self.rebuild_in_memory,
                                     make_queue=follow_queue)
        self.store_hosts_seen: set[tuple[str, int]] = set()  # filled by a full walk (rebuild)
        self.topics: dict[str, int] = load_topics(self.dir / "config")
        for topic, qid in self.cqs.queues:
            self.topics[topic] = max(self.topics.get(topic, 0), qid + 1)
        self.corruption: list[str] = []
        self.cuts = 0  # times a followed writer's log was cut back below what was served (follow.py)
        self.problems: list[str] = []  # what else an operator must know (positions brought back, loops stalled)
        self._reported: set[object] = set()  # physical offsets (or texts) already reported
        self.recovered = False
        self.write_offset = 0
        self.flushed_offset = 0
        self.closed = False
        self.dispatch_cache = DispatchCache(config.dispatch_cache_records)

    def release_lock(self) -> None:
        """Give the store's lock back (at close: another writer may open it then)."""
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None

    @property
    def min_offset(self) -> int:
        return self.segments.min_offset

    def report(self, problem: str, offset: int | None = None) -> None:
        """Remember and log a corruption found (shown by GetStoreStatus), once: a problem at a
        physical offset already reported (by recovery or an earlier read) is not repeated."""
        key: object = offset if offset is not None else problem
        if key in self._reported:
            return
        self._reported.add(key)
        self.corruption.append(problem)
        log_event(log, "corruption found", logging.ERROR, dir=str(self.dir), problem=problem)

    def damaged(self, offset: int) -> bool:
        """A record at this physical offset was reported corrupt."""
        return offset in self._reported
