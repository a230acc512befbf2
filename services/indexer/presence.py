"""The indexer's key presence filter and its watchers (WatchKeyPresence, indexer.proto).

The filter (services/key_presence.py) holds the key hash of every entry of this indexer's
IndexFiles. Routers watch it so that a key query skips the brokers that cannot hold the key.
Their copies are advisory (docs/decisions/key-presence-advisory.md): the tailer adds each
batch's hashes and position in the step that writes the batch, every watcher gets them
queued, and nothing waits for a watcher. A watcher that falls MAX_QUEUED updates behind (a
slow or gone router) is dropped: its stream ends UNAVAILABLE and it watches again. Its
snapshot's chunks are kept apart and do not count (the largest filter is 512 of them: a
router slow to read it would be dropped before it had it, again at every watch). Whether a
copy can be trusted is the router's question (services/query/presence.py).

At start the filter is built from the IndexFiles on disk in a thread (the tailer's adds go
into it meanwhile); watchers wait for it. When more keys were added than it was sized for, a
larger one is built the same way and every watcher is dropped to fetch it: until then the
full one only answers "may hold" more often. Files deleted by retention leave their bits
set (more false "may hold", never a miss) until the next resize or restart.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from typing import AsyncIterator

from quarry.v1 import indexer_pb2
from quarry.services.errors import Unavailable
from quarry.services.indexer.index_store import IndexStore
from quarry.services.key_presence import BITS_PER_KEY, MAX_LOG2_BITS, KeyPresence, log2_bits_for
from quarry.services.log import log_event

log = logging.getLogger("quarry.index.presence")

HEARTBEAT_S = 0.25  # the longest a watcher goes without an update
BUILD_RETRY_S = 30.0  # after a failed build
CHUNK_BYTES = 1 << 20  # a snapshot travels in updates of this many bytes
MIN_KEYS = 1 << 20  # the smallest filter is sized for this many keys
MAX_QUEUED = 1024  # updates queued for one watcher before it is dropped as too slow


class _Watcher:
    """One watching stream: its queued updates, and why it ended."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[indexer_pb2.WatchKeyPresenceResponse | None] = asyncio.Queue()  # after the snapshot
        self.snapshot: collections.deque[indexer_pb2.WatchKeyPresenceResponse] = collections.deque()  # sent first
        self.seq = 0  # of the last update queued or sent
        self.closed: Exception | None = None

    def stamp(self, update: indexer_pb2.WatchKeyPresenceResponse) -> indexer_pb2.WatchKeyPresenceResponse:
        self.seq += 1
        update.seq, update.heartbeat_ms = self.seq, int(HEARTBEAT_S * 1000)
        update.queued = len(self.snapshot) + self.queue.qsize()  # behind it as it leaves: the copy is not current
        return update

    def close(self, why: Exception) -> None:
        if self.closed is None:
            self.closed = why
            self.queue.put_nowait(None)


class KeyPresencePublisher:
    """The filter, its (re)builds, and the watchers. `lock` is the index's: every change of
    the filter happens under it, in the same step as the index write it reports."""

    def __init__(self, index: IndexStore, lock: threading.Lock) -> None:
        self.index, self.lock = index, lock
        self.filter: KeyPresence | None = None  # None until the first build is done
        self._building: KeyPresence | None = None
        self._watchers: set[_Watcher] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: asyncio.Event | None = None
        self.failed = ""  # why no filter could be built (watchers are refused)
        self._retry_at = 0.0  # after a failed build, none is begun before this (monotonic)
        self._stopping = False

    def start(self) -> "KeyPresencePublisher":
        """Build the filter from the files on disk (on the loop that will use it)."""
        self._loop = asyncio.get_running_loop()
        self._ready = asyncio.Event()
        with self.lock:
            self._begin_build(MIN_KEYS)
        return self

    @property
    def watchers(self) -> int:
        return len(self._watchers)

    def add(self, key_hashes: list[int]) -> None:
        """Under the lock, right after a batch is written to the index: its hashes go into the
        filter and, with the index's new position, to every watcher."""
        for f in (self.filter, self._building):
            if f is not None and key_hashes:
                f.add(key_hashes)
        cur = self.filter
        # Full: rebuilt larger, unless it is the largest (a rebuild as large would re-read every
        # file and drop every watcher, again at each batch, for no fewer false "may hold").
        if (cur is not None and self._building is None and cur.added > (1 << cur.log2_bits) // BITS_PER_KEY and cur.log2_bits < MAX_LOG2_BITS
                and time.monotonic() >= self._retry_at):
            self._begin_build(cur.added * 2)
        for w in list(self._watchers):
            if w.queue.qsize() >= MAX_QUEUED:
                log_event(log, "key presence watcher dropped: too far behind", logging.WARNING, queued=w.queue.qsize())
                self._drop(w, Unavailable(f"key presence: {MAX_QUEUED} updates not read; watch again"))
            else:
                w.queue.put_nowait(indexer_pb2.WatchKeyPresenceResponse(
                    key_hashes=key_hashes, position=self.index.last_update_phy_offset, epoch=self.index.epoch))

    # -- builds ------------------------------------------------------------------------------
    def _begin_build(self, keys: int) -> None:
        """Under the lock: a filter for max(keys, 2x the entries on disk), built in a thread
        (what is added meanwhile goes into it too)."""
        files = [(f, f.entries) for f in self.index.files]
        target = KeyPresence(log2_bits_for(max(keys, MIN_KEYS, 2 * sum(n for _, n in files))))
        self._building = target
        threading.Thread(target=self._build, args=(target, files), name="key-presence-build", daemon=True).start()

    def _build(self, target: KeyPresence, files: list) -> None:  # type: ignore[type-arg]
        t0, error = time.monotonic(), ""
        try:
            for f, entries in files:
                try:
                    for chunk in f.key_hash_chunks(1, entries + 1):
                        with self.lock:
                            target.add(chunk)
                except FileNotFoundError:
                    with self.lock:
                        if f in self.index.files:  # a file still queried must be in the filter
                            raise
        except Exception as exc:  # a filter missing a file's keys would hide them: none instead
            error = f"{type(exc).__name__}: {exc}"
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(self._built, target, error, time.monotonic() - t0)
        except RuntimeError:  # the loop closed: the indexer stopped meanwhile
            pass

    def _built(self, target: KeyPresence, error: str, seconds: float) -> None:
        with self.lock:
            if self._building is not target:
                return
            self._building = None
            if error:
                # Tried again after a pause (a transient read error must not cost the saving
                # for good, nor a failing rebuild be begun again at every batch).
                self._retry_at = time.monotonic() + BUILD_RETRY_S
                if self.filter is None:
                    self.failed = f"key presence filter not built: {error}"
                    assert self._ready is not None and self._loop is not None
                    self._ready.set()  # waiting watchers are refused
                    self._loop.call_later(BUILD_RETRY_S, self._retry_first_build)
                log_event(log, "key presence filter not built; routers ask this broker every key query", logging.ERROR,
                          error=error, retry_in_s=BUILD_RETRY_S)
                return
            resized = self.filter is not None
            self.filter, self.failed = target, ""
            watchers = list(self._watchers)
        log_event(log, "key presence filter built", bytes=target.nbytes, keys=target.added, seconds=round(seconds, 3))
        for w in watchers if resized else []:
            self._drop(w, Unavailable("key presence: the filter was resized; watch again"))
        assert self._ready is not None
        self._ready.set()

    def _retry_first_build(self) -> None:
        with self.lock:
            if self.filter is None and self._building is None and not self._stopping:
                self._begin_build(MIN_KEYS)

    # -- watchers ----------------------------------------------------------------------------
    def close(self) -> None:
        """End every watch (the indexer stops): a stream open to the end would hold the whole
        shutdown grace."""
        self._stopping = True
        if self._ready is not None:
            self._ready.set()  # and those waiting for a first build that may take long
        for w in list(self._watchers):
            self._drop(w, Unavailable("key presence: the indexer is stopping; watch again"))

    def _drop(self, w: _Watcher, why: Exception) -> None:
        self._watchers.discard(w)
        w.close(why)

    async def watch(self) -> AsyncIterator[indexer_pb2.WatchKeyPresenceResponse]:
        """The updates of one watcher: the snapshot, then batches and heartbeats."""
        assert self._ready is not None
        while self.filter is None or self._stopping:
            if self._stopping:
                raise Unavailable("key presence: the indexer is stopping; watch again")
            if self.failed:
                raise Unavailable(self.failed)
            await self._ready.wait()
        w = _Watcher()
        with self.lock:  # between two adds: the snapshot holds every batch written so far
            assert self.filter is not None
            f = self.filter
            chunks = f.chunks(CHUNK_BYTES)
            for i, (offset, chunk) in enumerate(chunks):
                w.snapshot.append(indexer_pb2.WatchKeyPresenceResponse(
                    log2_bits=f.log2_bits, hash_count=f.hashes, chunk_offset=offset, chunk=chunk,
                    snapshot_done=i == len(chunks) - 1, position=self.index.last_update_phy_offset, epoch=self.index.epoch))
            self._watchers.add(w)
        try:
            while w.snapshot and w.closed is None:
                yield w.stamp(w.snapshot.popleft())
            while True:
                try:
                    # asyncio.timeout, not wait_for: on 3.11 wait_for may swallow a cancellation
                    # that comes as the get completes (CPython gh-86296), and the watch would run on.
                    async with asyncio.timeout(HEARTBEAT_S):
                        update = await w.queue.get()
                except TimeoutError:
                    if not w.queue.empty():  # came as the wait ended: it goes first
                        continue
                    # Adds run on this loop: with none queued, the index's position is the copy's.
                    update = indexer_pb2.WatchKeyPresenceResponse(position=self.index.last_update_phy_offset, epoch=self.index.epoch)
                if update is None:
                    assert w.closed is not None
                    raise w.closed
                yield w.stamp(update)
        finally:
            self._drop(w, Unavailable("key presence: the watch ended"))
