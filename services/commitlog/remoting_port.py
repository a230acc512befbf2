"""The commitlog's RocketMQ 4 remoting port: its server, the broker handlers, and the
thread that writes consumer offsets on an interval (and once more at stop)."""
from __future__ import annotations

import argparse
import asyncio
import logging
import threading

from quarry.services.commitlog.consumer_offsets import ConsumerOffsets
from quarry.formats.addresses import split_host_port
from quarry.services.commitlog.convert import resolve_store_host
from quarry.services.commitlog.flush_signal import FlushSignal
from quarry.services.commitlog.remoting_broker import RemotingBroker
from quarry.services.commitlog.server import CommitLogServicer
from quarry.services.commitlog.store import CommitLogStore
from quarry.services.log import log_event
from quarry.services.remoting.acl import RemotingAcl
from quarry.services.remoting.server import RemotingServer
from quarry.services.security import configured_accounts

log = logging.getLogger("quarry.commitlog")


class RemotingPort:
    def __init__(self, server: RemotingServer, broker: RemotingBroker, offsets: ConsumerOffsets, address: str, interval_s: float) -> None:
        self.server, self.broker, self.offsets, self.address = server, broker, offsets, address
        self._stop = threading.Event()
        self._persister = threading.Thread(target=self._persist_loop, args=(interval_s,), name="offsets", daemon=True)
        self._persister.start()

    def _persist_loop(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            self._persist()

    def _persist(self) -> None:
        try:
            self.offsets.persist()
        except OSError as exc:
            log_event(log, "consumer offsets not persisted; will retry", logging.ERROR, path=str(self.offsets.path), error=str(exc))

    def stop_persisting(self) -> None:
        """At stop, off the loop (the store's close writes the last commits)."""
        self._stop.set()
        self._persister.join(timeout=5)

    async def close(self) -> None:
        await self.server.close()
        self.broker.close()


def advertised(address: str) -> str:
    """The remoting address announced to the router: a wildcard or name resolved to an IP."""
    ip, port = resolve_store_host(address)
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


async def start_remoting(args: argparse.Namespace, servicer: CommitLogServicer, store: CommitLogStore, stopping: threading.Event) -> RemotingPort | None:
    if not args.remoting_bind:
        return None
    offsets = store.consumer_offsets
    appended = FlushSignal(asyncio.get_running_loop())
    servicer.on_appended = appended.fire_in_loop
    broker = RemotingBroker(servicer, offsets, appended, stopping, indexer_addr=args.indexer_addr)
    accounts = configured_accounts()
    server = RemotingServer("commitlog", broker.handlers(), args.remoting_max_frame_bytes, RemotingAcl(accounts) if accounts is not None else None)
    server.on_close.append(broker.connection_closed)
    await server.start(args.remoting_bind)
    split_host_port(args.remoting_advertise)  # validated by the settings; raises on a malformed address
    return RemotingPort(server, broker, offsets, advertised(args.remoting_advertise), args.offsets_persist_interval_ms / 1000.0)
