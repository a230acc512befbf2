"""gRPC stubs to brokers' commitlogs and indexers, one channel per address, reused."""
from __future__ import annotations

import threading

import grpc

from quarry.channels import open_channel

from quarry.v1 import commitlog_pb2_grpc, indexer_pb2_grpc

_OPTIONS = [
    ("grpc.max_receive_message_length", 128 * 1024 * 1024),
    # Re-resolve quickly after a broker restarts at the same address.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


class BrokerClients:
    """Cached channels and stubs keyed by address."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}

    def _channel(self, address: str) -> grpc.Channel:
        with self._lock:
            ch = self._channels.get(address)
            if ch is None:
                ch = open_channel(address, options=_OPTIONS)
                self._channels[address] = ch
            return ch

    def commitlog(self, address: str) -> commitlog_pb2_grpc.CommitLogServiceStub:
        return commitlog_pb2_grpc.CommitLogServiceStub(self._channel(address))

    def indexer(self, address: str) -> indexer_pb2_grpc.IndexerServiceStub:
        return indexer_pb2_grpc.IndexerServiceStub(self._channel(address))

    def close(self) -> None:
        with self._lock:
            for ch in self._channels.values():
                ch.close()
            self._channels.clear()
