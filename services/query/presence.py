"""The router's copies of its brokers' key presence filters (WatchKeyPresence, indexer.proto).

A key or unique-key query asks only the brokers whose copy says they may hold the key; a
broker without a valid copy is asked, as before there were copies. A copy is valid while its
lease runs: `lease_ms` from the moment the latest acknowledgement the indexer echoes as
received (an update's `acked`) was queued to be sent, which is before the indexer received
it, and the indexer holds a batch back from its queries until every watcher acknowledged it
or the lease of its latest acknowledgement received ran out (services/indexer/presence.py). So a valid copy holds every key the broker's QueryMessage can find, and
skipping a broker it rules out never hides a message.

One watch per indexer address, started by the first query that names it, on the router's
loop; it watches again after a failure (a new snapshot) or a silence of SILENT_LEASES leases
(the indexer sends at least a heartbeat each third of one), and an indexer that keeps no filter
(read-only, or older than key presence) or refuses the watch (ACL) is asked again only every
REFUSED_RETRY_S.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import AsyncIterator, Callable, Sequence

import grpc

from quarry.formats import scheduled
from quarry.formats.index_keys import key_name
from quarry.formats.java_hash import index_key_hash
from quarry.v1 import indexer_pb2, indexer_pb2_grpc
from quarry.services.key_presence import KeyPresence
from quarry.services.log import log_event
from quarry.services.silent_streams import Silent, within

log = logging.getLogger("quarry.router.presence")

SILENT_LEASES = 10  # a watch silent this many leases is ended and watched again
SILENT_MIN_S = 10.0  # and never sooner (a snapshot chunk may take a while on a slow link)
RETRY_S = (0.2, 10.0)  # first and longest pause before watching again after a failure
REFUSED_RETRY_S = 60.0  # an indexer that keeps no filter
_ACKS_TRACKED = 4096  # acknowledgements remembered until echoed (an older echo extends nothing)
# Keeps none (read-only, older), or does not let this router watch (ACL: a watch is a stream
# call, which the router does not sign): asked every key query, watched again after a minute.
_REFUSED = (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


def key_hashes(topic: str, key: str) -> list[int]:
    """The IndexFile key hashes a key of `topic` may be indexed under (as the indexer's query
    reads them: the topic's own and the parking topics of delayed messages)."""
    return [index_key_hash(key_name(t, key)) for t in scheduled.index_topics(topic)]


async def _next_or_silent(call: grpc.aio.StreamStreamCall, silent_s: float, address: str) -> indexer_pb2.WatchKeyPresenceResponse | None:
    """The next update (None at the stream's end). An indexer sends one at least every third of
    its lease; a watch silent for `silent_s` (0: no limit yet) is over, though it never ended: a
    peer gone without a word (a half-open connection) would otherwise hold it for good, and
    its copy would stay untrusted until the router restarts."""
    if not silent_s:
        u = await call.read()
    else:
        u = await within(call.read(), silent_s, f"no update from {address} within {silent_s:g} s (it sends one every third of its lease)")
    return None if u is grpc.aio.EOF else u


class _Copy:
    """One indexer's filter as last received, and until when it may be trusted."""

    def __init__(self) -> None:
        self.filter: KeyPresence | None = None
        self.valid_until = 0.0  # monotonic
        self.task: asyncio.Task[None] | None = None
        self.refused = ""  # the indexer keeps no filter: why (logged once)
        self.leaving = False
        self.acks: asyncio.Queue[indexer_pb2.WatchKeyPresenceRequest | None] | None = None
        self.snapshots = 0  # whole snapshots received (a watch that worked)
        self.whole_since = 0.0  # monotonic: when the latest one was

    def rules_out(self, hashes: Sequence[int]) -> bool:
        f = self.filter
        if f is None or time.monotonic() >= self.valid_until:
            return False
        for h in hashes:
            if f.may_hold(h):
                return False
        return True

    def invalidate(self) -> None:
        self.filter, self.valid_until = None, 0.0

    def leave(self) -> None:
        """Stop using the copy and tell the indexer, so it need not wait for this watcher."""
        self.leaving = True
        self.invalidate()
        if self.acks is not None:
            self.acks.put_nowait(indexer_pb2.WatchKeyPresenceRequest(release=True))
            self.acks.put_nowait(None)


class PresenceCopies:
    """Copies by indexer address. Use on the router's loop."""

    def __init__(self, stub: Callable[[str], indexer_pb2_grpc.IndexerServiceStub]) -> None:
        self._stub = stub
        self._copies: dict[str, _Copy] = {}

    def rules_out(self, indexer_addr: str, hashes: Sequence[int]) -> bool:
        """True when a valid copy says this indexer holds none of `hashes`; starts watching
        an address seen for the first time (it is asked meanwhile)."""
        copy = self._copies.get(indexer_addr)
        if copy is None:
            copy = self._copies[indexer_addr] = _Copy()
            copy.task = asyncio.ensure_future(self._watch(indexer_addr, copy))
            return False
        return copy.rules_out(hashes)

    def valid(self, indexer_addr: str) -> bool:
        copy = self._copies.get(indexer_addr)
        return copy is not None and copy.filter is not None and time.monotonic() < copy.valid_until

    async def _watch(self, address: str, copy: _Copy) -> None:
        pause, bad = RETRY_S[0], ""
        while not copy.leaving:
            copy.acks = asyncio.Queue()
            snapshots = copy.snapshots
            try:
                await self._follow(address, copy, copy.acks)
                why = "the indexer ended the watch"
            except asyncio.CancelledError:
                copy.invalidate()
                raise
            except grpc.aio.AioRpcError as exc:
                why = f"{exc.code().name}: {exc.details()}"
                if exc.code() in _REFUSED:
                    if copy.refused != why:
                        log_event(log, "indexer's key presence not watched; it is asked every key query", logging.INFO, indexer=address, reason=why)
                    copy.refused = why
                    pause = REFUSED_RETRY_S
            except Silent as exc:
                why = str(exc)
                # Said once per episode: not again at each retry that stays silent.
                if (why != bad or copy.snapshots != snapshots) and not copy.leaving:
                    log_event(log, "key presence watch silent; watching again", logging.WARNING, indexer=address, reason=why)
                bad = why
            except Exception as exc:  # a bad update: drop the copy and watch again
                why = f"{type(exc).__name__}: {exc}"
                if why != bad:  # the indexer breaks the protocol: said once per reason, not per retry
                    log_event(log, "bad key presence update; copy dropped, watching again", logging.WARNING, indexer=address, error=why)
                bad = why
            finally:
                copy.invalidate()
            if copy.leaving:
                return
            if not copy.refused:
                log_event(log, "key presence watch ended; watching again", logging.DEBUG, indexer=address, reason=why)
            if copy.snapshots != snapshots and time.monotonic() - copy.whole_since >= RETRY_S[1] and pause < REFUSED_RETRY_S:
                # It worked for a while: its end (a resize, a restart) is not one of a run of
                # failures. One that ends at once (too slow for the indexer) still backs off.
                pause = RETRY_S[0]
            await asyncio.sleep(pause)
            pause = min(RETRY_S[1], pause * 2) if pause < REFUSED_RETRY_S else RETRY_S[0]

    async def _follow(self, address: str, copy: _Copy, acks: "asyncio.Queue[indexer_pb2.WatchKeyPresenceRequest | None]") -> None:
        async def ack_stream() -> AsyncIterator[indexer_pb2.WatchKeyPresenceRequest]:
            while (ack := await acks.get()) is not None:
                yield ack

        call = self._stub(address).WatchKeyPresence(ack_stream())
        building: KeyPresence | None = None
        sent: deque[tuple[int, float]] = deque(maxlen=_ACKS_TRACKED)  # (seq, when queued) not yet echoed
        silent_s = 0.0  # known from the first update's lease (the first build may take long)
        try:
            while True:
                u = await _next_or_silent(call, silent_s, address)
                if u is None:
                    return
                silent_s = max(SILENT_LEASES * u.lease_ms / 1000.0, SILENT_MIN_S)
                if u.log2_bits:  # a snapshot's chunk
                    if building is None:
                        copy.invalidate()
                        building = KeyPresence(u.log2_bits, u.hash_count)
                    building.merge(u.chunk, u.chunk_offset)
                    if u.snapshot_done:
                        copy.filter, building, copy.refused = building, None, ""
                        copy.snapshots, copy.whole_since = copy.snapshots + 1, time.monotonic()
                elif u.key_hashes:
                    if copy.filter is None:
                        raise ValueError(f"key presence update {u.seq} of {address} came before a whole snapshot")
                    copy.filter.add(u.key_hashes)
                if u.acked:
                    # Valid from when the acknowledgement the indexer received was queued (its lease
                    # starts later). Not from the latest one queued: the indexer may have given up
                    # on this watcher before receiving it, and written batches this copy lacks.
                    if u.acked >= u.seq:  # every update before this one is acknowledged, no later one
                        raise ValueError(f"acked: {u.acked} in update {u.seq} of {address}, beyond the acknowledgements sent")
                    queued_at = 0.0
                    while sent and sent[0][0] <= u.acked:
                        seq, at = sent.popleft()
                        queued_at = at if seq == u.acked else queued_at
                    if copy.filter is not None and queued_at:
                        copy.valid_until = max(copy.valid_until, queued_at + u.lease_ms / 1000.0)
                sent.append((u.seq, time.monotonic()))
                acks.put_nowait(indexer_pb2.WatchKeyPresenceRequest(seq=u.seq))
        finally:
            if not copy.leaving:
                call.cancel()

    def forget(self, keep: set[str]) -> None:
        """Stop watching addresses not in `keep` (each watch leaves: the indexer ends it)."""
        for address in [a for a in self._copies if a not in keep]:
            self._copies.pop(address).leave()

    async def close(self, wait_s: float = 1.0) -> None:
        """Leave every watch; cancel what has not ended within `wait_s`."""
        tasks = [c.task for c in self._copies.values() if c.task is not None]
        self.forget(set())
        if tasks:
            _done, late = await asyncio.wait(tasks, timeout=wait_s)
            for t in late:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
