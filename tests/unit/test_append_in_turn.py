"""SendPath.append_in_turn: single-message calls that reach the send path in one turn of the
event loop are stored by one append, each answered with its own record or its own error; a
caller gone before the turn's append is not stored."""
from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any, Awaitable, Callable, TypeVar

import pytest

from quarry.services.commitlog.storage.errors import InvalidArgument
from quarry.services.commitlog.broker.flush_signal import FlushSignal
from quarry.services.commitlog.storage.message_input import Host, NewMessage
from quarry.services.commitlog.doors.quarry_v1 import CommitLogServicer
from quarry.services.commitlog.broker.core import Broker
from quarry.services.commitlog.storage.store import CommitLogStore, StoreConfig

T = TypeVar("T")
PEER = Host("127.0.0.5", 40000)


def _run(tmp_path: Path, body: Callable[[CommitLogServicer], Awaitable[T]], **config: Any) -> T:
    async def main() -> T:
        store = CommitLogStore(StoreConfig(store_dir=tmp_path, **config))
        flushed = FlushSignal(asyncio.get_running_loop())
        store.add_flush_listener(flushed.fire)
        servicer = CommitLogServicer(Broker(store, "broker-a", threading.Event(), flushed))
        try:
            return await body(servicer)
        finally:
            store.close()

    return asyncio.run(main())


def _msg(key: str, topic: str = "TurnTopic", body: bytes = b"body", queue_id: int = -1) -> NewMessage:
    return NewMessage(topic, body, [key], unique_key=f"U-{key}", queue_id=queue_id, born_host=PEER)


def test_calls_of_one_turn_are_stored_by_one_append_each_with_its_own_record(tmp_path: Path) -> None:
    async def body(servicer: CommitLogServicer) -> None:
        appends = []
        servicer.sending.append_listeners.append(lambda: appends.append(1))
        got = await asyncio.gather(*(servicer.sending.append_in_turn(_msg(f"k{i}"), "test") for i in range(5)))
        assert len(appends) == 1  # one append for the five
        assert [a[0].unique_key for a in got] == [f"U-k{i}" for i in range(5)]
        offsets = [a[0].physical_offset for a in got]
        assert offsets == sorted(offsets) and len(set(offsets)) == 5
        for a in got:  # each record is there, under its own offset
            assert servicer.store.read(a[0].physical_offset).properties["KEYS"] == a[0].unique_key[2:]
            assert len(a) == 1 and a.bytes == a.rows[0][1]

    _run(tmp_path, body)


def test_calls_of_one_turn_each_take_their_own_round_robin_turn(tmp_path: Path) -> None:
    async def body(servicer: CommitLogServicer) -> list[int]:
        got = await asyncio.gather(*(servicer.sending.append_in_turn(_msg(f"k{i}"), "test") for i in range(4)))
        return [a[0].queue_id for a in got]

    # As four calls one after another would be spread (a batch's messages would all follow the first).
    assert sorted(_run(tmp_path, body, default_queues=4)) == [0, 1, 2, 3]


def test_a_refused_message_fails_alone_and_the_others_of_its_turn_are_stored(tmp_path: Path) -> None:
    async def body(servicer: CommitLogServicer) -> None:
        sending = servicer.sending
        good = [sending.append_in_turn(_msg(f"k{i}"), "test") for i in range(3)]
        bad = sending.append_in_turn(_msg("bad", queue_id=9), "test")  # the topic has 4 queues
        got = await asyncio.gather(good[0], bad, good[1], good[2], return_exceptions=True)
        assert isinstance(got[1], InvalidArgument) and "queue_id" in str(got[1])
        assert "messages[" not in str(got[1])  # named as in a call of its own, not as a batch's
        stored = [a for a in got if not isinstance(a, BaseException)]
        assert [a[0].unique_key for a in stored] == ["U-k0", "U-k1", "U-k2"]
        for a in stored:
            assert servicer.store.read(a[0].physical_offset).properties["UNIQ_KEY"] == a[0].unique_key

    _run(tmp_path, body, default_queues=4)


def test_a_caller_gone_before_the_append_is_not_stored(tmp_path: Path) -> None:
    async def body(servicer: CommitLogServicer) -> None:
        sending = servicer.sending
        kept = asyncio.ensure_future(sending.append_in_turn(_msg("kept"), "test"))
        gone = asyncio.ensure_future(sending.append_in_turn(_msg("gone"), "test"))
        await asyncio.sleep(0)  # both queued, the turn's append not run yet
        assert len(sending._turn) == 2
        gone.cancel()
        a = await kept
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert servicer.store.write_offset == a.end  # only the kept message

    _run(tmp_path, body)


def test_each_caller_of_a_sync_store_waits_for_the_fsync_of_its_record(tmp_path: Path) -> None:
    async def body(servicer: CommitLogServicer) -> None:
        got = await asyncio.gather(*(servicer.sending.append_in_turn(_msg(f"k{i}"), "test") for i in range(3)))
        assert all(a.flushed for a in got)
        assert servicer.store.flushed_offset >= max(a.end for a in got)

    _run(tmp_path, body, flush_mode="SYNC", flush_interval_ms=120_000)


def test_a_call_alone_is_stored_at_once(tmp_path: Path) -> None:
    async def body(servicer: CommitLogServicer) -> None:
        sending = servicer.sending
        sending.has_company = lambda: False  # no other call in flight on the server
        appends = []
        sending.append_listeners.append(lambda: appends.append(1))
        first = asyncio.ensure_future(sending.append_in_turn(_msg("a"), "test"))
        second = asyncio.ensure_future(sending.append_in_turn(_msg("b"), "test"))
        await asyncio.sleep(0)  # both ran to their append: neither waited for the turn's end
        assert len(appends) == 2 and not sending._turn
        assert [(await first)[0].unique_key, (await second)[0].unique_key] == ["U-a", "U-b"]

    _run(tmp_path, body)


def test_the_callers_own_word_on_company_overrides_the_process_s(tmp_path: Path) -> None:
    async def body(servicer: CommitLogServicer) -> None:
        sending = servicer.sending
        sending.has_company = lambda: False  # no quarry.v1 call in flight (a remoting door's sends are not counted there)
        appends: list[int] = []
        sending.append_listeners.append(lambda: appends.append(1))
        await asyncio.gather(*(sending.append_in_turn(_msg(f"a{i}"), "test") for i in range(3)))
        assert len(appends) == 3  # alone by the process's measure: each stored at once
        await asyncio.gather(*(sending.append_in_turn(_msg(f"b{i}"), "test", company=True) for i in range(3)))
        assert len(appends) == 4  # the door knows its connection's other requests: one append for the three
        await sending.append_in_turn(_msg("c"), "test", company=False)
        assert len(appends) == 5

    _run(tmp_path, body)
