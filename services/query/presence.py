"""The router's copies of its brokers' key presence filters (WatchKeyPresence, indexer.proto).

A key or unique-key query asks only the brokers whose copy says they may hold the key; a
broker whose copy cannot be trusted is asked, as before there were copies. The copies are
advisory (docs/decisions/key-presence-advisory.md): the indexer never waits for this router.
A copy is trusted while its updates keep coming (one at least every heartbeat_ms the indexer
names: STALE_HEARTBEATS of them without one and it is not) and its position is not behind any
position of that indexer this router has seen in an answer (`seen`): once a query found a
message through a broker, no later query skips that broker on a copy older than that answer.
Positions are log offsets, which move back when the indexer drops entries the log no longer
holds (a cut or repaired log): they compare only within one index epoch (random per indexer
process, renewed at each such drop), which answers and updates carry. A copy of another epoch
than the last answer seen is not trusted; the filter itself stays good across a new epoch
(bits are never cleared: dropped keys only answer "may hold"), so the copy goes on and is
trusted again once its updates reach the answer's epoch and position.
Nor is a copy trusted while its latest update was sent with more queued behind it (`queued`):
an update is fresh when it arrives, but a router working through a backlog would otherwise
trust a copy well behind the index.

One watch per indexer address, started by the first query that names it, on the router's
loop; it watches again after a failure (a new snapshot) or a silence of SILENT_S, and an
indexer that keeps no filter (read-only, or older than key presence) or refuses the watch
(ACL) is asked again only every REFUSED_RETRY_S.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Sequence

import grpc

from quarry.formats import scheduled
from quarry.formats.index_keys import key_hashes_under
from quarry.v1 import indexer_pb2, indexer_pb2_grpc
from quarry.services.key_presence import KeyPresence
from quarry.services.log import log_event
from quarry.services.silent_streams import Silent, within

log = logging.getLogger("quarry.router.presence")

STALE_HEARTBEATS = 4  # a copy not updated for this many of its indexer's heartbeats is not trusted
SILENT_S = 10.0  # a watch silent this long is ended and watched again (a snapshot chunk may take a while)
RETRY_S = (0.2, 10.0)  # first and longest pause before watching again after a failure
REFUSED_RETRY_S = 60.0  # an indexer that keeps no filter
# Keeps none (read-only, older), or does not let this router watch (ACL): asked every key
# query, watched again after a minute.
_REFUSED = (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


def key_hashes(topic: str, key: str) -> list[int]:
    """The IndexFile key hashes a key of `topic` may be indexed under (as the indexer's query
    reads them: the topic's own and the parking topics of delayed messages)."""
    return key_hashes_under(scheduled.index_topics(topic), key)


class _Copy:
    """One indexer's filter as last received, and whether it may be trusted."""

    def __init__(self) -> None:
        self.filter: KeyPresence | None = None
        self.position = -1  # the index position the copy is whole up to
        self.epoch = 0  # of `position` (0: an indexer older than epochs)
        self.seen = -1  # the furthest position of this indexer seen in an answer ...
        self.seen_epoch: int | None = None  # ... of the latest answer's epoch (None: no answer yet)
        self.fresh_until = 0.0  # monotonic: trusted until then, unless updated again
        self.behind = False  # the latest update left the indexer with more queued behind it
        self.task: asyncio.Task[None] | None = None
        self.refused = ""  # the indexer keeps no filter: why (logged once)
        self.leaving = False
        self.snapshots = 0  # whole snapshots received (a watch that worked)
        self.whole_since = 0.0  # monotonic: when the latest one was

    def trusted(self) -> bool:
        return (self.filter is not None and time.monotonic() < self.fresh_until and not self.behind
                and (self.seen_epoch is None or self.epoch == self.seen_epoch) and self.position >= self.seen)

    def rules_out(self, hashes: Sequence[int]) -> bool:
        f = self.filter
        if f is None or not self.trusted():
            return False
        for h in hashes:
            if f.may_hold(h):
                return False
        return True

    def invalidate(self) -> None:
        self.filter, self.fresh_until = None, 0.0

    def leave(self) -> None:
        """Stop using the copy and end its watch."""
        self.leaving = True
        self.invalidate()
        if self.task is not None:
            self.task.cancel()


class PresenceCopies:
    """Copies by indexer address. Use on the router's loop."""

    def __init__(self, stub: Callable[[str], indexer_pb2_grpc.IndexerServiceStub]) -> None:
        self._stub = stub
        self._copies: dict[str, _Copy] = {}

    def rules_out(self, indexer_addr: str, hashes: Sequence[int]) -> bool:
        """True when a trusted copy says this indexer holds none of `hashes`; starts watching
        an address seen for the first time (it is asked meanwhile)."""
        copy = self._copies.get(indexer_addr)
        if copy is None:
            copy = self._copies[indexer_addr] = _Copy()
            copy.task = asyncio.ensure_future(self._watch(indexer_addr, copy))
            return False
        return copy.rules_out(hashes)

    def position(self, indexer_addr: str) -> int:
        """The index position this indexer's copy is whole up to (-1: none yet)."""
        copy = self._copies.get(indexer_addr)
        return copy.position if copy is not None else -1

    def seen(self, indexer_addr: str, position: int, epoch: int = 0) -> None:
        """An answer of this indexer came from `position` of `epoch`: its copy is not trusted
        below it, nor in another epoch (an answer of a new epoch replaces what was seen: its
        positions do not compare with the old one's; a late answer of an old epoch does too,
        which only distrusts the copy until the next answer)."""
        copy = self._copies.get(indexer_addr)
        if copy is None:
            return
        if epoch != copy.seen_epoch:
            copy.seen_epoch, copy.seen = epoch, position
        elif position > copy.seen:
            copy.seen = position

    def valid(self, indexer_addr: str) -> bool:
        copy = self._copies.get(indexer_addr)
        return copy is not None and copy.trusted()

    async def _watch(self, address: str, copy: _Copy) -> None:
        pause, bad = RETRY_S[0], ""
        while not copy.leaving:
            snapshots = copy.snapshots
            try:
                await self._follow(address, copy)
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

    async def _follow(self, address: str, copy: _Copy) -> None:
        call = self._stub(address).WatchKeyPresence(indexer_pb2.WatchKeyPresenceRequest())
        building: KeyPresence | None = None
        try:
            while True:
                u = await within(call.read(), SILENT_S, f"no update from {address} within {SILENT_S:g} s (it sends one every heartbeat)")
                if u is grpc.aio.EOF:
                    return
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
                if copy.filter is not None and building is None:
                    copy.position, copy.epoch, copy.behind = u.position, u.epoch, u.queued > 0
                    copy.fresh_until = time.monotonic() + STALE_HEARTBEATS * u.heartbeat_ms / 1000.0
        finally:
            call.cancel()

    def forget(self, keep: set[str]) -> None:
        """Stop watching addresses not in `keep`."""
        for address in [a for a in self._copies if a not in keep]:
            self._copies.pop(address).leave()

    async def close(self) -> None:
        """End every watch."""
        tasks = [c.task for c in self._copies.values() if c.task is not None]
        self.forget(set())
        await asyncio.gather(*tasks, return_exceptions=True)
