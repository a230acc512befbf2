"""A caught-up Tail in ASYNC mode gets a new record at the next flush it asks for, not at the
flush interval: right after a flush there is nothing to flush, so it waits for the next
append and asks then (before, its request was dropped and a paced writer's records waited
for the interval)."""
from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from quarry.services.commitlog.doors import quarry_v1 as server
from quarry.services.commitlog.broker.core import Broker
from quarry.services.commitlog.broker.flush_signal import FlushSignal
from quarry.services.commitlog.storage.message_input import NewMessage
from quarry.services.commitlog.doors.quarry_v1 import CommitLogServicer
from quarry.services.commitlog.storage.store import CommitLogStore, StoreConfig
from quarry.v1 import commitlog_pb2


def test_a_caught_up_tail_gets_the_next_append_without_waiting_for_the_interval(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "TAIL_IDLE_S", 120.0)  # no keep-alive round to ask again meanwhile

    async def main() -> list[str]:
        store = CommitLogStore(StoreConfig(store_dir=tmp_path, flush_interval_ms=120_000))  # an interval the test never reaches
        flushed = FlushSignal(asyncio.get_running_loop())
        store.add_flush_listener(flushed.fire)
        servicer = CommitLogServicer(Broker(store, "broker-a", threading.Event(), flushed))
        keys: asyncio.Queue[str] = asyncio.Queue()

        async def tail() -> None:
            async for response in servicer.Tail(commitlog_pb2.TailRequest(from_offset=0), None):
                for record in response.records:
                    keys.put_nowait(record.keys)

        tailing = asyncio.ensure_future(tail())
        try:
            got = []
            for key in ("first", "second", "third"):
                await servicer.sending.append_flushed([NewMessage("TailTopic", b"body", [key])])
                got.append(await asyncio.wait_for(keys.get(), 30))  # far below the interval
            return got
        finally:
            tailing.cancel()
            servicer.stopping.set()
            store.close()

    assert asyncio.run(main()) == ["first", "second", "third"]
