"""The indexer's key presence filter and its watchers (WatchKeyPresence, indexer.proto).

The filter (services/key_presence.py) holds the key hash of every entry of this indexer's
IndexFiles. Routers watch it so that a key query skips the brokers that cannot hold the key,
which is only exact if a watcher's copy never lacks a key that QueryMessage can find. Hence
the order the tailer keeps for each batch (tailer.py): `add` the batch's hashes (into the
filter, and as an update to every watcher), `await acknowledged()`, and only then write the
entries where queries read them. A watcher that does not acknowledge within its lease is
dropped; the router stops trusting its copy `lease_s` after it sent the latest acknowledgement
this side says (each update's `acked`) it received, so when the wait here gives up the copy is
no longer used, even if the router reads updates sent before that much later. A dropped
watcher's stream ends UNAVAILABLE and the router watches again (snapshot); a watcher dropped
before its lease ran out (resize, broken stream, stop) holds every later batch to its end.

At start the filter is built from the IndexFiles on disk in a thread (the tailer's adds go
into it meanwhile); watchers wait for it. When more keys were added than it was sized for, a
larger one is built the same way and every watcher is dropped to fetch it: until then the
full one only answers "may hold" more often. Files deleted by retention leave their bits
set (more false "may hold", never a miss) until the next resize or restart.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import AsyncIterator, Sequence

from quarry.v1 import indexer_pb2
from quarry.services.errors import InvalidArgument, Unavailable
from quarry.services.indexer.index_store import IndexStore
from quarry.services.key_presence import BITS_PER_KEY, MAX_LOG2_BITS, KeyPresence, log2_bits_for
from quarry.services.log import log_event

log = logging.getLogger("quarry.index.presence")

LEASE_S = 1.0  # how long an acknowledgement keeps a watcher's copy valid
LEASE_MARGIN_S = 0.05  # waited beyond a lease: monotonic clocks of two processes may drift a little
BUILD_RETRY_S = 30.0  # after a failed build
HOLD_LEASES = 5  # a batch waits for a watcher at most this many leases (then its lease's end)
CHUNK_BYTES = 1 << 20  # a snapshot travels in updates of this many bytes
MIN_KEYS = 1 << 20  # the smallest filter is sized for this many keys


class _Watcher:
    """One watching stream: its queued updates, what it acknowledged, its lease."""

    def __init__(self, lease_s: float) -> None:
        self.lease_s = lease_s
        self.queue: asyncio.Queue[indexer_pb2.WatchKeyPresenceResponse | None] = asyncio.Queue()
        self.seq = 0  # of the last update queued
        self.acked = 0
        self.lease_until = time.monotonic() + lease_s  # the snapshot's own time to arrive
        self.changed = asyncio.Event()
        self.closed: Exception | None = None
        self.released = False  # it closed its side cleanly: it no longer uses its copy
        self.last_sent = time.monotonic()

    def stamp(self, update: indexer_pb2.WatchKeyPresenceResponse) -> int:
        self.seq += 1
        update.seq, update.lease_ms = self.seq, int(self.lease_s * 1000)
        return self.seq

    def enqueue(self, update: indexer_pb2.WatchKeyPresenceResponse) -> int:
        seq = self.stamp(update)
        self.queue.put_nowait(update)
        return seq

    def ack(self, seq: int) -> None:
        if self.closed is not None:
            # Given up on (or broken): its lease no longer runs, and updates still queued must
            # not tell the router of an acknowledgement received after that (their `acked`).
            return
        if seq > self.seq:
            self.close(InvalidArgument(f"seq: acknowledged {seq}, beyond the last update sent ({self.seq})"))
            return
        self.acked = max(self.acked, seq)
        self.lease_until = time.monotonic() + self.lease_s
        self.changed.set()

    def close(self, why: Exception) -> None:
        if self.closed is None:
            self.closed = why
            self.queue.put_nowait(None)
            self.changed.set()


async def _next_update(w: _Watcher, heartbeat_s: float) -> indexer_pb2.WatchKeyPresenceResponse | None:
    """The watcher's next queued update (None: it is closed), else a heartbeat once `heartbeat_s`
    passed since the last one sent. Whatever is queued goes first, however late the sender is:
    a wait with no time left cancels the get before it starts, so a sender that fell behind the
    heartbeat (a slow link, a busy loop) and waited anyway would never read its queue again."""
    while w.queue.empty():
        left = w.last_sent + heartbeat_s - time.monotonic()
        if left <= 0:
            update = indexer_pb2.WatchKeyPresenceResponse()
            w.stamp(update)
            return update
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for may swallow a cancellation that
            # comes as the get completes (CPython gh-86296), and the watch would run on.
            async with asyncio.timeout(left):
                return await w.queue.get()
        except TimeoutError:
            pass  # an update that came as the wait ended is still queued: looked at again
    return w.queue.get_nowait()


class KeyPresencePublisher:
    """The filter, its (re)builds, and the watchers. `lock` is the index's: every change of
    the filter happens under it, as do the index writes it must precede."""

    def __init__(self, index: IndexStore, lock: threading.Lock, lease_s: float = LEASE_S) -> None:
        self.index, self.lock, self.lease_s = index, lock, lease_s
        self.filter: KeyPresence | None = None  # None until the first build is done
        self._building: KeyPresence | None = None
        self._inflight: list[Sequence[int]] = []  # added, not yet written to the index
        self._watchers: set[_Watcher] = set()
        # Until when a dropped watcher's router may still trust its copy: batches it will never
        # see (added after the drop) are written only after that (acknowledged).
        self._hold_until = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: asyncio.Event | None = None
        self.failed = ""  # why no filter could be built (watchers are refused)
        self._retry_at = 0.0  # after a failed build, none is begun before this (monotonic)
        self._stopping = False

    def start(self) -> "KeyPresencePublisher":
        """Build the filter from the files on disk (on the loop that will use it)."""
        self._loop = asyncio.get_running_loop()
        self._ready = asyncio.Event()
        # A router may still trust a copy from this indexer's previous run (a crash, a quick
        # restart) for up to a lease: what this run writes first waits that out.
        self._hold_until = time.monotonic() + self.lease_s + LEASE_MARGIN_S
        with self.lock:
            self._begin_build(MIN_KEYS)
        return self

    @property
    def watchers(self) -> int:
        return len(self._watchers)

    # -- the tailer's side (add under the lock, await, write, written under the lock) ------
    def add(self, key_hashes: Sequence[int]) -> list[tuple[_Watcher, int]]:
        """Under the lock: the hashes go into the filter and to every watcher; returns what to
        await (acknowledged) before the entries are written."""
        self._inflight.append(key_hashes)  # `written` pops it, in order
        if not key_hashes:
            return []
        for f in (self.filter, self._building):
            if f is not None:
                f.add(key_hashes)
        cur = self.filter
        # Full: rebuilt larger, unless it is the largest (a rebuild as large would re-read every
        # file and drop every watcher, again at each batch, for no fewer false "may hold").
        if (cur is not None and self._building is None and cur.added > (1 << cur.log2_bits) // BITS_PER_KEY and cur.log2_bits < MAX_LOG2_BITS
                and time.monotonic() >= self._retry_at):
            self._begin_build(cur.added * 2)
        if not self._watchers:
            return []
        hashes = list(key_hashes)
        return [(w, w.enqueue(indexer_pb2.WatchKeyPresenceResponse(key_hashes=hashes))) for w in self._watchers]

    async def acknowledged(self, waits: list[tuple[_Watcher, int]]) -> None:
        """Until each watcher acknowledged its update, released its copy, or its lease ran out
        (then it is dropped). A stream that broke is waited on to the end of the lease too: the
        router may not have noticed yet and trusts its copy until then; so is a watcher dropped
        for any reason but its lease (a broken stream, a resize, a stop), for every batch."""
        give_up = time.monotonic() + HOLD_LEASES * self.lease_s
        for w, seq in waits:
            while w.acked < seq and not w.released:
                now = time.monotonic()
                lease_end = w.lease_until + LEASE_MARGIN_S
                if now >= lease_end:
                    if w.closed is None:
                        log_event(log, "key presence watcher dropped: lease ran out", logging.WARNING, seq=seq, acked=w.acked)
                    self._drop(w, Unavailable(f"key presence: no acknowledgement of update {seq} within the {self.lease_s:g} s lease; watch again"))
                    break
                if w.closed is None and now >= give_up:
                    # Acknowledging, but not this update: a watcher whose acknowledgements fall
                    # behind renews its lease and would hold indexing back for ever. Dropped, its
                    # lease is waited out below (_hold_until), as for any drop.
                    log_event(log, "key presence watcher dropped: it holds indexing back", logging.WARNING, seq=seq, acked=w.acked)
                    self._drop(w, Unavailable(f"key presence: update {seq} not acknowledged within {HOLD_LEASES * self.lease_s:g} s; watch again"))
                    break
                w.changed.clear()
                try:
                    # (asyncio.timeout, not wait_for: on 3.11 wait_for may swallow the cancellation
                    # of a stopping tailer that comes as the event is set)
                    async with asyncio.timeout((lease_end if w.closed is not None else min(lease_end, give_up)) - now):
                        await w.changed.wait()
                except TimeoutError:
                    pass
        left = self._hold_until - time.monotonic()
        if left > 0:
            await asyncio.sleep(left)

    def written(self) -> None:
        """Under the lock, after the oldest added batch is in the index (or will not be: a
        failed or cancelled write; its records are delivered and added again, and what part
        of it was written is in the files a build reads)."""
        if self._inflight:
            self._inflight.pop(0)

    # -- builds ------------------------------------------------------------------------------
    def _begin_build(self, keys: int) -> None:
        """Under the lock: a filter for max(keys, 2x the entries on disk), built in a thread."""
        files = [(f, f.entries) for f in self.index.files]
        target = KeyPresence(log2_bits_for(max(keys, MIN_KEYS, 2 * sum(n for _, n in files))))
        for hashes in self._inflight:  # added before this build began, not yet in any file
            target.add(hashes)
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
        w.close(why)  # its lease stops here (later acknowledgements are ignored)
        if not w.released:
            # Resized, broken, ended: its router trusts its copy to the lease's end, unaware.
            self._hold_until = max(self._hold_until, w.lease_until + LEASE_MARGIN_S)

    async def watch(self, acks: AsyncIterator[indexer_pb2.WatchKeyPresenceRequest]) -> AsyncIterator[indexer_pb2.WatchKeyPresenceResponse]:
        """The updates of one watcher: the snapshot, then batches and heartbeats."""
        assert self._ready is not None
        while self.filter is None or self._stopping:
            if self._stopping:
                raise Unavailable("key presence: the indexer is stopping; watch again")
            if self.failed:
                raise Unavailable(self.failed)
            await self._ready.wait()
        w = _Watcher(self.lease_s)
        with self.lock:  # between two adds: the snapshot holds every batch added so far
            assert self.filter is not None
            f = self.filter
            chunks = f.chunks(CHUNK_BYTES)
            for i, (offset, chunk) in enumerate(chunks):
                w.enqueue(indexer_pb2.WatchKeyPresenceResponse(log2_bits=f.log2_bits, hash_count=f.hashes, chunk_offset=offset, chunk=chunk,
                                                        snapshot_done=i == len(chunks) - 1))
            self._watchers.add(w)
        reader = asyncio.ensure_future(self._read_acks(acks, w))
        heartbeat = self.lease_s / 3
        try:
            while True:
                update = await _next_update(w, heartbeat)
                if update is None:
                    assert w.closed is not None
                    raise w.closed
                w.last_sent = time.monotonic()
                update.acked = w.acked  # the router's copy is valid from when it sent this one
                yield update
        finally:
            reader.cancel()
            self._drop(w, Unavailable("key presence: the watch ended"))

    async def _read_acks(self, acks: AsyncIterator[indexer_pb2.WatchKeyPresenceRequest], w: _Watcher) -> None:
        try:
            async for ack in acks:
                if ack.release:
                    w.released = True
                    break
                w.ack(ack.seq)
        except Exception:  # the stream broke
            pass
        # Without a release the watcher may still trust its copy: waited on to its lease's end.
        self._drop(w, Unavailable("key presence: the watcher left" if w.released else "key presence: the watch broke"))
