"""A transaction check reaches only a RocketMQ 5 producer whose account may publish the half's
topic (review finding, issue 33): what a client announces in its settings is its own word."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

from quarry.services.commitlog.broker.transaction_check import TransactionCheck
from quarry.services.rmq5.auth import AUTHORIZATION, CLIENT_ID, DATE_TIME, Authenticator, authorization_header
from quarry.services.rmq5.contract import Code, service, v2
from quarry.services.commitlog.doors.rmq5_transaction import half_message
from quarry.services.security import Account
from tests.unit.test_rmq5 import _Ctx, _send_servicer, _store, sdk_message

ACCOUNTS = {"qx": Account("qx", "qx-secret", False, {"TopicX": {"query"}}),
            "owner": Account("owner", "owner-secret", False, {"OrderTopic": {"publish"}})}


def test_an_orphaned_half_goes_only_to_a_producer_that_may_publish_its_topic(tmp_path: Path) -> None:
    store = _store(tmp_path)

    async def main() -> None:
        servicer = _send_servicer(store, asyncio.get_running_loop())
        servicer.auth = Authenticator(ACCOUNTS)
        (stored,) = store.append_many([half_message(sdk_message(tag="tx", keys=["secret-key"], message_type=v2.MessageType.TRANSACTION), ("127.0.0.1", 5))])
        half = store.read(stored.physical_offset)
        hold = asyncio.Event()

        async def commands() -> object:
            yield service.TelemetryCommand(settings=v2.Settings(client_type=v2.ClientType.PRODUCER,
                                                                publishing=v2.Publishing(topics=[v2.Resource(name="OrderTopic")])))
            await hold.wait()

        def stream(who: str, secret: str) -> object:
            dt = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
            return servicer.Telemetry(commands(), _Ctx({DATE_TIME: dt, AUTHORIZATION: authorization_header(who, secret, dt), CLIENT_ID: "same-id"}))

        spy = stream("qx", "qx-secret")
        assert Code.Name((await spy.__anext__()).status.code) == "OK"  # (its settings are answered)
        assert servicer.ask_producer(half, TransactionCheck.request(half, 1)) is False  # nobody who may publish OrderTopic
        owner = stream("owner", "owner-secret")
        await owner.__anext__()
        assert servicer.ask_producer(half, TransactionCheck.request(half, 1)) is True
        command = (await asyncio.wait_for(owner.__anext__(), 5)).recover_orphaned_transaction_command
        assert command.message.topic.name == "OrderTopic"
        assert len(servicer.outboxes) == 2  # the same client id on two streams: neither took the other's place
        servicer.close()
        hold.set()
        for s in (spy, owner):
            async for _ in s:
                pass

    try:
        asyncio.run(main())
    finally:
        store.close()
