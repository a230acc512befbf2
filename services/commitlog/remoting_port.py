"""The commitlog's RocketMQ 4 remoting port: its server and the broker handlers."""
from __future__ import annotations

import argparse
import asyncio

from quarry.services.commitlog.broker.broker_settings import BrokerSettings, rocketmq_settings
from quarry.services.commitlog.doors.quarry_v1_convert import resolve_store_host
from quarry.services.commitlog.broker.core import Broker
from quarry.services.commitlog.doors.remoting import RemotingBroker
from quarry.services.commitlog.doors.remoting_queries import KeyIndex
from quarry.services.remoting.acl import ACCESS_KEY, RemotingAcl
from quarry.services.remoting.server import RemotingServer, known_key_check, limits_from
from quarry.services.security import configured_accounts
from quarry.services.settings import StartupError, named


class RemotingPort:
    def __init__(self, server: RemotingServer, broker: RemotingBroker, address: str) -> None:
        self.server, self.broker, self.address = server, broker, address
        self._stop_sampling = asyncio.Event()
        self._sampling = asyncio.ensure_future(broker.runtime.run(self._stop_sampling))  # brokerStatus's rates
        self._stats_sampling = asyncio.ensure_future(broker.stats.run(self._stop_sampling))  # statsAll's windows

    async def close(self) -> None:
        self._stop_sampling.set()
        await self.server.close()
        await self.broker.close()
        await asyncio.wait([self._sampling, self._stats_sampling], timeout=1)


def advertised(address: str) -> str:
    """The remoting address announced to the router: a wildcard or name resolved to an IP."""
    ip, port = resolve_store_host(address)
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


async def start_remoting(args: argparse.Namespace, core: Broker, key_index: KeyIndex | None = None) -> RemotingPort | None:
    """The remoting port listening on --remoting-bind, or None when off. A bind that fails
    or an announced address that does not resolve stops the start (StartupError: one line)."""
    if not args.remoting_bind:
        return None
    try:
        address = advertised(args.remoting_advertise)  # first: a name that does not resolve binds nothing
    except (OSError, ValueError) as exc:
        raise StartupError(f"{named('--remoting-advertise')}: {args.remoting_advertise} is not an address to announce ({exc})") from None
    accounts = configured_accounts()
    acl = accounts is not None
    broker = RemotingBroker(core, indexer_addr=args.indexer_addr,
                            settings=BrokerSettings(rocketmq_settings(args, acl)), key_index=key_index)
    # With ACL on, a request naming no account is refused from its header, before its body is read.
    server = RemotingServer("commitlog", broker.handlers(), args.remoting_max_frame_bytes, RemotingAcl(accounts) if accounts is not None else None,
                            known_key_check(ACCESS_KEY, accounts) if accounts is not None else None, limits_from(args, acl))
    server.on_close.append(broker.connection_closed)
    await server.start(args.remoting_bind)  # raises StartupError naming --remoting-bind
    return RemotingPort(server, broker, address)
