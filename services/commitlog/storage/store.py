"""One broker's store: a small façade over the modules that do the work.

Plain Python over files (no gRPC). `store_state` holds what the parts share, `recovery`
opens and repairs, `append` stores (one lock; encoding and validation before it),
`flushing` makes it durable and is the one way to wait for an fsync, `reads` serves
records and dispatch infos, `retention` drops old segments. Tail readers only ever see the
fsynced prefix, which recovery can never truncate.
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Callable, Sequence

from quarry.formats.dispatch import DispatchInfo
from quarry.formats.state_file import fsync_dir
from quarry.formats.record import Record
from quarry.formats.topic import TopicError, validate_topic
from quarry.services.commitlog.storage import reads, retention
from quarry.services.commitlog.storage.append import MAX_BATCH_BYTES, MAX_BATCH_MESSAGES, Appended, AppendResult, Appender
from quarry.services.commitlog.storage.consume_queue_store import ConsumeQueueStore
from quarry.services.commitlog.storage.consumer_groups import ConsumerGroups
from quarry.services.commitlog.storage.consumer_offsets import ConsumerOffsets
from quarry.services.commitlog.storage.dispatch_cache import DispatchCache
from quarry.services.commitlog.storage.dispatchers import ConsumeQueueDispatcher, Dispatcher
from quarry.services.commitlog.storage.errors import DiskFull, InvalidArgument, NotFound, ReadOnly
from quarry.services.commitlog.storage.flushing import Flusher, wait_flushed_blocking
from quarry.services.commitlog.storage.follow import Follower
from quarry.services.commitlog.storage.message_input import MessageFields, queue_out_of_range
from quarry.services.commitlog.storage.positions import reconcile_positions
from quarry.services.commitlog.storage.recovery import recover
from quarry.services.commitlog.storage.routing import Routing
from quarry.services.commitlog.storage.segments import SegmentQueue
from quarry.services.commitlog.storage.store_state import ABORT_FILE, StoreConfig, StoreState
from quarry.services.commitlog.storage.topic_table import save_topics
from quarry.services.log import log_event
from quarry.services.progress import Progress

log = logging.getLogger("quarry.store")

__all__ = ["Appended", "AppendResult", "CommitLogStore", "StoreConfig", "StoreStatus", "MAX_BATCH_BYTES", "MAX_BATCH_MESSAGES"]


@dataclass
class StoreStatus:
    min_offset: int
    max_offset: int
    committed_offset: int
    segments: list[tuple[str, int, int, int]]  # name, start, written, size
    topics: dict[str, list[int]]  # topic -> max queue offset per queue
    flush_mode: str
    read_only: bool
    corruption: list[str]
    recovered: bool


class CommitLogStore:
    """The store. Thread-safe; one instance per store directory."""

    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        self.state = StoreState(config)
        self.dir = self.state.dir
        self.read_only = self.state.read_only
        try:
            self._open(config)
        except BaseException:
            self.state.release_lock()  # a store that did not open holds nothing (an embedding process goes on)
            raise

    def _open(self, config: StoreConfig) -> None:
        recover(self.state)
        # Consumer groups' committed offsets (RocketMQ 4 remoting today, RocketMQ 5 consumer
        # groups too): part of the store, written at close and by the serving process's interval.
        # A followed broker's config/ is its own (fastjson, which Python's json need not read): not loaded.
        self.consumer_offsets = ConsumerOffsets(self.dir / "config", self.read_only, load=not config.follow)
        # RocketMQ 5 consumer groups' pop state (in flight, acked, dead-lettered), journaled.
        self.consumer_groups = ConsumerGroups(self.dir, self.read_only, fsync_each=config.flush_mode == "SYNC")
        if not self.read_only and not config.follow:
            reconcile_positions(self.state.cqs, self.consumer_offsets, self.consumer_groups, self.state.problems.append)
        # What reacts to a record once placed, in order (the follower's records as the append's).
        self.dispatchers: list[Dispatcher] = [ConsumeQueueDispatcher(self.state.cqs), self.state.dispatch_cache]
        self._routing = Routing(self.state)
        self._appender = Appender(self.state, self.dispatchers)
        self.flusher = Flusher(self.state, self.delete_expired)
        self.disk_full = ""  # why the last append failed for want of space ("" once one succeeds)
        self.retention_progress = Progress("retention", unit="segments")
        self.follower: Follower | None = None
        if config.follow:
            # Another process writes this directory: catch up with it now, then keep following.
            self.follower = Follower(self.state, self.dispatchers, self.flusher.notify, config.follow_interval_ms)
            self.follower.poll()
            self.follower.start()
        elif not self.read_only:
            (self.dir / ABORT_FILE).touch(mode=0o600)
            # Durable before any write: after a power cut the marker, not an older clean
            # checkpoint, must decide that recovery scans the log.
            fsync_dir(self.dir)
            self.flusher.start()

    # -- the shared state, read by the server and tests -------------------------------------
    @property
    def lock(self) -> threading.Lock:
        return self.state.lock

    @property
    def segments(self) -> SegmentQueue:
        return self.state.segments

    @property
    def cqs(self) -> ConsumeQueueStore:
        return self.state.cqs

    @property
    def topics(self) -> dict[str, int]:
        return self.state.topics

    @property
    def write_offset(self) -> int:
        return self.state.write_offset

    @property
    def flushed_offset(self) -> int:
        return self.state.flushed_offset

    @property
    def committed_offset(self) -> int:
        """End of the durable prefix: what Tail may stream."""
        return self.state.flushed_offset

    @property
    def min_offset(self) -> int:
        return self.state.min_offset

    @property
    def dispatch_cache(self) -> DispatchCache:
        return self.state.dispatch_cache

    @property
    def corruption(self) -> list[str]:
        return self.state.corruption

    @property
    def recovered(self) -> bool:
        return self.state.recovered

    # -- append ---------------------------------------------------------------------------
    def append(self, msg: MessageFields) -> AppendResult:
        """Validate, store and (in SYNC mode) fsync one message."""
        return self.append_many([msg])[0]

    def append_many(self, msgs: Sequence[MessageFields], same_topic: bool = True, wait_flush: bool = True,
                    peer: tuple[str, int] | None = None, independent: bool = False) -> Appended:
        """Store messages in order with one write per segment touched; all or nothing on bad input.
        A message whose born host has no IP was born at `peer` (the caller's address).
        `independent`: the messages come from calls of their own (routing.Routing.route).

        In SYNC mode it returns once the messages are fsynced, unless wait_flush is False: the
        caller then waits itself with `flushing.await_flushed` (an event loop must not block),
        marking the results not flushed on timeout."""
        self._appender.check(msgs)
        with self.state.lock:
            if self.state.closed:
                raise ReadOnly("store is closed")
            routes = self._routing.route(msgs, same_topic, peer, independent)
            try:
                appended = self._appender.append_locked(msgs, routes, peer)
            except DiskFull as exc:
                self.disk_full = str(exc)  # health: NOT_SERVING until space returns (services/commitlog/health.py)
                raise
            self._routing.commit(routes)
            self.disk_full = ""
        if self.config.flush_mode == "SYNC" and wait_flush:
            if not wait_flushed_blocking(self.flusher, appended.end, self.config.sync_flush_timeout_ms / 1000.0):
                appended.flushed = False
        return appended

    def create_topic(self, topic: str, queues: int) -> bool:
        """Create a topic with `queues` queues unless it exists (RocketMQ creates a consumer
        group's retry topic this way, before any message); returns whether it was created."""
        try:
            validate_topic(topic)
        except TopicError as exc:
            raise InvalidArgument("topic", str(exc).split(": ", 1)[-1]) from None
        if self.read_only:
            raise ReadOnly("store is read-only")
        if not self._set_queues(topic, queues, grow=False):
            return False
        log_event(log, "topic created", topic=topic, queues=queues)
        return True

    def ensure_queues(self, topic: str, queues: int) -> None:
        """Make `topic` (a system topic: not validated) have at least `queues` queues, creating
        it or adding queues (a RocketMQ store's SCHEDULE_TOPIC_XXXX has one per delay level)."""
        if self.state.topics.get(topic, 0) >= queues:
            return
        if self.read_only or self.state.closed:
            raise ReadOnly("store is read-only" if self.read_only else "store is closed")
        if self._set_queues(topic, queues, grow=True):
            log_event(log, "topic queues set", topic=topic, queues=queues)

    def _set_queues(self, topic: str, queues: int, grow: bool) -> bool:
        """Give `topic` `queues` queues in the topic table (saved) if it has none, or, with
        `grow`, fewer; whether it changed."""
        with self.state.lock:
            have = self.state.topics.get(topic)
            if have is not None and (not grow or have >= queues):
                return False
            topics = {**self.state.topics, topic: queues}
            save_topics(self.dir / "config", topics)
            self.state.topics = topics
        return True

    def queue_for(self, topic: str, queue_id: int, field_prefix: str = "") -> int:
        """The queue a message of `topic` asking for `queue_id` goes to (-1: the broker's
        round-robin choice, one turn taken), for a message message_input.reject has passed
        (topic name, queue_id >= -1): that the topic exists or may be created, the queue in
        range, as an append checks them. For a message stored elsewhere first (a delayed one
        is parked) and delivered to its queue later; nothing is created here."""
        with self.state.lock:
            queues = self.state.topics.get(topic)
            if queues is None:
                if not self.config.auto_create_topics:
                    raise NotFound(f"topic {topic} does not exist and auto-creation is off")
                queues = self.config.default_queues
            if queue_id >= queues:
                raise queue_out_of_range(field_prefix, queue_id, topic, queues)
            return queue_id if queue_id >= 0 else self._routing.next_turn(topic, queues)

    # -- flush ----------------------------------------------------------------------------
    def flush(self, clean: bool = False) -> int:
        """fsync everything written so far; wake SYNC waiters and tailers. Returns the flushed offset."""
        return self.flusher.flush(clean)

    def add_flush_listener(self, listener: Callable[[], None]) -> None:
        """Call `listener` (from the flushing thread) each time the durable end may have moved."""
        self.flusher.add_listener(listener)

    def request_flush(self, gap_s: float = 0.0) -> None:
        """Flush now rather than at the next interval: someone waits on the durable end (a
        SYNC sender; or, with a `gap_s` (flushing.*_FLUSH_GAP_S), a tailer or consumer in
        ASYNC mode, which should not wait a whole interval but may wait a few ms, so one
        flush serves a run of sends)."""
        self.flusher.request_flush(gap_s)

    # -- read -----------------------------------------------------------------------------
    def read(self, physical_offset: int) -> Record:
        """The record starting at physical_offset (NotFound / Expired / InvalidArgument)."""
        return reads.read_record(self.state, physical_offset)

    def read_bytes(self, physical_offset: int) -> tuple[Record, bytes]:
        """The record at physical_offset and its stored bytes (as `read` checks them)."""
        return reads.read_record_bytes(self.state, physical_offset)

    def read_key_fields(self, physical_offset: int) -> tuple[str, int, str, bytes]:
        """(topic, store timestamp, properties text, stored bytes) of the record at
        physical_offset, checked as `read` checks it (see reads.read_key_fields)."""
        return reads.read_key_fields(self.state, physical_offset)

    def pull(self, topic: str, queue_id: int, queue_offset: int, max_count: int) -> tuple[list[Record], int, int, int]:
        """See reads.pull: (records, next, min, max queue offset)."""
        return reads.pull(self.state, topic, queue_id, queue_offset, max_count)

    def read_dispatch(self, from_offset: int, max_records: int, until: int) -> tuple[list[DispatchInfo], int]:
        """See reads.read_dispatch: (infos, next offset)."""
        return reads.read_dispatch(self.state, from_offset, max_records, until)

    def check_tail_start(self, offset: int) -> None:
        """Raise unless `offset` is where a Tail may start: a record start or the end."""
        reads.check_tail_start(self.state, offset)

    # -- retention ------------------------------------------------------------------------
    def delete_expired(self, now_s: float | None = None) -> int:
        """Delete segments older than the reserved time, oldest first, never the active one."""
        return retention.delete_expired(self.state, now_s, self.retention_progress)

    # -- status ---------------------------------------------------------------------------
    def status(self) -> StoreStatus:
        state = self.state
        with state.lock:
            segs = []
            for s in state.segments.segments:
                written = max(0, min(state.write_offset, s.end) - s.start)
                segs.append((s.path.name, s.start, written, s.size))
            topics = {}
            for topic, n in sorted(state.topics.items()):
                topics[topic] = [(cq.max_offset if (cq := state.cqs.existing(topic, q)) else 0) for q in range(n)]
            return StoreStatus(state.min_offset, state.write_offset, state.flushed_offset, segs, topics, self.config.flush_mode,
                               self.read_only, list(state.corruption), state.recovered)

    def close(self) -> None:
        """Flush, write a clean checkpoint, remove the abort marker, close files."""
        if self.state.closed:
            return
        try:
            if self.follower is not None:
                self.follower.stop()
            if not self.read_only:
                self.flusher.stop()
                self.flusher.flush(clean=True)
            with self.state.lock:
                self.state.closed = True
            self.flusher.notify()
            try:
                self.consumer_offsets.persist()
            except OSError as exc:
                log_event(log, "consumer offsets not persisted at close", logging.ERROR, error=str(exc))
            try:
                self.consumer_groups.close()
            except OSError as exc:
                log_event(log, "consumer group journal not closed cleanly", logging.ERROR, error=str(exc))
            self.state.segments.close()
            self.state.cqs.close()
            if not self.read_only:
                try:
                    os.unlink(self.dir / ABORT_FILE)
                except FileNotFoundError:
                    pass
        finally:
            self.state.release_lock()  # last (also when closing failed): recovery makes the store whole for the next writer
