"""The router's broker channels: cached per address, closed once no registered broker has the
address and it has gone unused for a while (each holds a connection)."""
from __future__ import annotations

from quarry.services.query.broker_clients import BrokerClients
from quarry.v1 import commitlog_pb2
from tests.servicers import InProcessBroker, on_loop


def test_the_router_closes_channels_of_addresses_no_broker_has_once_idle(broker: InProcessBroker) -> None:
    address = broker.commitlog_addr

    async def go() -> tuple[list[str], list[str], list[str], str]:
        clients = BrokerClients()
        try:
            status = await clients.commitlog(address).GetStoreStatus(commitlog_pb2.GetStoreStatusRequest(), timeout=5)
            kept = await clients.prune({address}, idle_s=0)          # still registered: kept
            recent = await clients.prune(set(), idle_s=3600)         # gone, but used just now: kept
            gone = await clients.prune(set(), idle_s=0)              # gone and idle: closed
            return kept, recent, gone + clients.addresses, status.broker_name
        finally:
            await clients.close()

    kept, recent, gone, name = on_loop(go())
    assert name == "broker-a"
    assert kept == [] and recent == [] and gone == [address]
