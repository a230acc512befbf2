"""grpc.aio stubs to brokers' commitlogs and indexers: one channel and one stub per address,
made on first use and reused by every query (creating either per query costs more than the
call). Used on the router's event loop only, which is also where the channels are made.

Unary calls go over a broker's frames carrier (frames_client.py) when it offers one, unless this
router signs its calls (ACL) or uses TLS: the carrier does neither."""
from __future__ import annotations

import time
from typing import Any, Callable

import grpc

from quarry.channels import open_aio_channel, signs_calls, uses_tls
from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, indexer_pb2, indexer_pb2_grpc
from quarry.services.query.frames_client import FramedStub, FramesCarrier
from quarry.services.query.presence import PresenceCopies

_MAX_RECEIVE = 128 * 1024 * 1024
_OPTIONS = [
    ("grpc.max_receive_message_length", _MAX_RECEIVE),
    # Re-resolve quickly after a broker restarts at the same address.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


_COMMITLOG = commitlog_pb2.DESCRIPTOR.services_by_name["CommitLogService"]
_INDEXER = indexer_pb2.DESCRIPTOR.services_by_name["IndexerService"]

# A channel to an address no registered broker has any more is closed once unused this long
# (a query that began before the change may still be using it).
PRUNE_IDLE_S = 60.0


class BrokerClients:
    """Cached channels and stubs keyed by address."""

    def __init__(self, frames: bool = True) -> None:
        self.frames = frames and not signs_calls() and not uses_tls()
        self._carriers: dict[str, FramesCarrier] = {}
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._commitlogs: dict[str, commitlog_pb2_grpc.CommitLogServiceStub] = {}
        self._indexers: dict[str, indexer_pb2_grpc.IndexerServiceStub] = {}
        self._used: dict[str, float] = {}  # address -> when a stub was last handed out (monotonic)
        self.presence = PresenceCopies(self.indexer)  # indexers' key presence filters, by address

    def _channel(self, address: str) -> grpc.aio.Channel:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = open_aio_channel(address, options=_OPTIONS)
        return ch

    def _carrier(self, address: str) -> FramesCarrier | None:
        """The address's frames carrier when it is up (asked for again a while after it ended)."""
        carrier = self._carriers.get(address)
        if carrier is None or carrier.retry_due():
            carrier = self._carriers[address] = FramesCarrier(address, self._channel(address), _MAX_RECEIVE)
        return carrier if carrier.ready else None

    def _stub_maker(self, make: Callable[[Any], Any], service: Any, address: str) -> Callable[[Any], Any]:
        if not self.frames:
            return make
        return lambda channel: FramedStub(make(channel), service, lambda: self._carrier(address))

    def commitlog(self, address: str) -> commitlog_pb2_grpc.CommitLogServiceStub:
        return self._stub(self._commitlogs, self._stub_maker(commitlog_pb2_grpc.CommitLogServiceStub, _COMMITLOG, address), address)

    def indexer(self, address: str) -> indexer_pb2_grpc.IndexerServiceStub:
        return self._stub(self._indexers, self._stub_maker(indexer_pb2_grpc.IndexerServiceStub, _INDEXER, address), address)

    def _stub(self, stubs: dict[str, Any], make: Callable[[Any], Any], address: str) -> Any:
        """The cached stub for `address` (made on first use), noting that it is in use."""
        self._used[address] = time.monotonic()
        stub = stubs.get(address)
        if stub is None:
            stub = stubs[address] = make(self._channel(address))
        return stub

    @property
    def addresses(self) -> list[str]:
        """The addresses a channel is open to."""
        return list(self._channels)

    async def prune(self, keep: set[str], idle_s: float = PRUNE_IDLE_S) -> list[str]:
        """Close the channels of addresses not in `keep` that
        have not been used for `idle_s`: a broker that moved or was forgotten. Returns them."""
        now = time.monotonic()
        self.presence.forget(keep)
        gone = [a for a in self._channels if a not in keep and now - self._used.get(a, 0.0) >= idle_s]
        for address in gone:
            channel = self._channels.pop(address)
            self._commitlogs.pop(address, None)
            self._indexers.pop(address, None)
            self._used.pop(address, None)
            carrier = self._carriers.pop(address, None)
            if carrier is not None:
                await carrier.close()
            await channel.close()
        return gone

    async def close(self) -> None:
        await self.presence.close()
        channels = list(self._channels.values())
        self._channels.clear()
        self._commitlogs.clear()
        self._indexers.clear()
        carriers, self._carriers = list(self._carriers.values()), {}
        for carrier in carriers:
            await carrier.close()
        for ch in channels:
            await ch.close()
