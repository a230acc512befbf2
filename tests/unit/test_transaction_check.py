"""The broker's transaction check (services/commitlog/broker/transaction_check.py): which halves are
asked about, how often, the discard after the last check, the cursor; and the remoting door's
asker (CHECK_TRANSACTION_STATE to a producer of the half's group, never to one that could not
have published it)."""
from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from quarry.formats.record import decode_record
from quarry.services.commitlog.broker.core import Broker
from quarry.services.commitlog.broker.flush_signal import FlushSignal
from quarry.services.commitlog.storage.message_input import NewMessage
from quarry.services.commitlog.doors.quarry_v1 import CommitLogServicer
from quarry.services.commitlog.storage.store import CommitLogStore, StoreConfig
from quarry.services.commitlog.broker.transaction_check import (
    CHECK_GROUP, DISCARD_TOPIC, CheckRequest, CheckSettings, TransactionCheck, as_sent,
)
from quarry.services.commitlog.broker.transactions import HALF_TOPIC, Transactions, as_half
from quarry.services.remoting import codes

HOUR = 3_600_000


def _half(n: int, topic: str = "TxTopic", group: str = "PG_tx", extra: list[tuple[str, str]] | None = None) -> NewMessage:
    props = [("TRAN_MSG", "true"), ("PGROUP", group), *(extra or [])]
    return as_half(NewMessage(topic, f"body {n}".encode(), [f"tx-{n}"], "TagA", f"UNIQ{n:04d}", props, 0, 1, 1_000, ("127.0.0.9", 4000), 0x4))


def _run(tmp_path: Path, scenario: Any, settings: CheckSettings = CheckSettings(timeout_ms=1000, interval_ms=10, max_checks=2)) -> None:
    store = CommitLogStore(StoreConfig(store_dir=tmp_path / "store", segment_size=1 << 20, store_host=("127.0.0.5", 10931)))  # type: ignore[arg-type]

    async def main() -> None:
        flushed = FlushSignal(asyncio.get_running_loop())
        store.add_flush_listener(flushed.fire)
        servicer = CommitLogServicer(Broker(store, "broker-a", threading.Event(), flushed))
        now = [0]
        check = TransactionCheck(store, servicer.broker.transactions, servicer.sending, settings, clock_ms=lambda: now[0])
        await scenario(store, servicer, check, now)

    try:
        asyncio.run(main())
    finally:
        store.close()


def test_halves_not_ended_are_asked_about_until_the_last_check_then_discarded(tmp_path: Path) -> None:
    async def scenario(store: CommitLogStore, servicer: CommitLogServicer, check: TransactionCheck, now: list[int]) -> None:
        halves = servicer.sending.store.append_many([_half(n) for n in range(4)], same_topic=False)
        asked: list[tuple[str, int]] = []
        check.askers.append(lambda half, req: asked.append((req.msg_id, req.check)) or True)
        # Nothing is due before the timeout (store time + 1 s).
        now[0] = max(h.store_timestamp for h in halves) + 500
        assert (await check.round()).asked == 0 and asked == []
        # The first half is committed by its producer: never asked about.
        tx: Transactions = servicer.broker.transactions
        first = tx.half_at(halves[0].physical_offset)
        tx.claim(first)
        await servicer.sending.append_flushed(Transactions.resolution(first, True), "test", same_topic=False)
        now[0] += HOUR
        report = await check.round()
        assert report.asked == 3 and asked == [("UNIQ0001", 1), ("UNIQ0002", 1), ("UNIQ0003", 1)]
        assert report.cursor == 1 and store.consumer_offsets.get(CHECK_GROUP, HALF_TOPIC, 0) == 1
        # The second is rolled back after the first check; the others are asked again.
        second = tx.half_at(halves[1].physical_offset)
        tx.claim(second)
        await servicer.sending.append_flushed(Transactions.resolution(second, False), "test", same_topic=False)
        asked.clear()
        report = await check.round()
        assert asked == [("UNIQ0002", 2), ("UNIQ0003", 2)] and report.cursor == 2
        # max_checks (2) made: the next round discards them to TRANS_CHECK_MAX_TIME_TOPIC.
        asked.clear()
        report = await check.round()
        assert asked == [] and [h.unique_key for h in report.discarded] == ["UNIQ0002", "UNIQ0003"]
        assert report.cursor == 4 and check.discards == 2
        copies, _, _, _ = store.pull(DISCARD_TOPIC, 0, 0, 10)
        assert [(c.unique_key, c.keys, c.body, c.properties["REAL_TOPIC"], c.properties["PGROUP"]) for c in copies] == \
            [(f"UNIQ000{n}", [f"tx-{n}"], f"body {n}".encode(), "TxTopic", "PG_tx") for n in (2, 3)]
        # A discarded half may still be ended by its producer (as on RocketMQ's broker); never asked again.
        tx.claim(tx.half_at(halves[3].physical_offset))
        assert (await check.round()).asked == 0 and asked == []

    _run(tmp_path, scenario)


def test_a_check_with_no_producer_online_counts_and_a_restart_resumes_from_the_cursor(tmp_path: Path) -> None:
    async def scenario(store: CommitLogStore, servicer: CommitLogServicer, check: TransactionCheck, now: list[int]) -> None:
        (half,) = store.append_many([_half(0)])
        now[0] = half.store_timestamp + HOUR
        report = await check.round()
        assert (report.asked, report.unasked) == (0, 1)
        await check.round()
        assert [h.unique_key for h in (await check.round()).discarded] == ["UNIQ0000"]
        # A new check (a restarted broker) starts at the cursor: the discarded half is behind it.
        again = TransactionCheck(store, Transactions(store), servicer.sending, check.settings, clock_ms=lambda: now[0])
        asked: list[CheckRequest] = []
        again.askers.append(lambda h, req: asked.append(req) or True)
        assert again.cursor == 1 and (await again.round()).asked == 0 and asked == []

    _run(tmp_path, scenario)


def test_a_half_with_its_own_immunity_time_waits_for_it_without_holding_back_the_others(tmp_path: Path) -> None:
    async def scenario(store: CommitLogStore, servicer: CommitLogServicer, check: TransactionCheck, now: list[int]) -> None:
        halves = store.append_many([_half(0, extra=[("CHECK_IMMUNITY_TIME_IN_SECONDS", "60")]), _half(1)], same_topic=False)
        asked: list[str] = []
        check.askers.append(lambda h, req: asked.append(req.msg_id) or True)
        now[0] = max(h.store_timestamp for h in halves) + 2_000
        await check.round()
        assert asked == ["UNIQ0001"]
        now[0] += 60_000
        await check.round()
        assert asked == ["UNIQ0001", "UNIQ0000", "UNIQ0001"]

    _run(tmp_path, scenario)


def test_the_check_body_is_the_message_under_its_real_topic_and_queue(tmp_path: Path) -> None:
    async def scenario(store: CommitLogStore, servicer: CommitLogServicer, check: TransactionCheck, now: list[int]) -> None:
        (appended,) = store.append_many([_half(7)])
        half = store.read(appended.physical_offset)
        shown = decode_record(as_sent(half))
        assert (shown.topic, shown.queue_id, shown.physical_offset, shown.queue_offset) == ("TxTopic", 1, half.physical_offset, half.queue_offset)
        assert (shown.body, shown.unique_key, shown.properties["PGROUP"], shown.offset_msg_id) == (b"body 7", "UNIQ0007", "PG_tx", half.offset_msg_id)
        req = TransactionCheck.request(half, 1)
        assert (req.tran_state_table_offset, req.commit_log_offset, req.msg_id, req.transaction_id, req.offset_msg_id, req.group, req.real_topic) == \
            (half.queue_offset, half.physical_offset, "UNIQ0007", "UNIQ0007", half.offset_msg_id, "PG_tx", "TxTopic")

    _run(tmp_path, scenario)


class _Writer:
    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        self.frames.append(data)


class _Account:
    def __init__(self, topics: set[str]) -> None:
        self.topics = topics

    def allows(self, permission: str, topics: list[str]) -> bool:
        return permission == "publish" and set(topics) <= self.topics


def test_the_remoting_asker_sends_check_transaction_state_only_to_a_producer_that_may_publish_the_topic(tmp_path: Path) -> None:
    from quarry.services.commitlog.doors.remoting import RemotingBroker
    from quarry.services.remoting.command import decode_frame
    from quarry.services.remoting.server import Connection

    async def scenario(store: CommitLogStore, servicer: CommitLogServicer, check: TransactionCheck, now: list[int]) -> None:
        broker = RemotingBroker(servicer.broker)
        (appended,) = store.append_many([_half(3)])
        half = store.read(appended.physical_offset)
        req = TransactionCheck.request(half, 1)
        assert not broker.ask_producer(half, req)  # nobody's heartbeat named PG_tx
        other, allowed = Connection(("127.0.0.1", 1), _Writer()), Connection(("127.0.0.1", 2), _Writer())  # type: ignore[arg-type]
        broker.clients.heartbeat({"clientID": "spy", "producerDataSet": [{"groupName": "PG_tx"}]}, other, _Account({"OtherTopic"}))
        assert not broker.ask_producer(half, req)  # its account may not publish to TxTopic: told nothing
        broker.clients.heartbeat({"clientID": "owner", "producerDataSet": [{"groupName": "PG_tx"}]}, allowed, _Account({"TxTopic"}))
        assert broker.ask_producer(half, req)
        assert other.writer.frames == []  # type: ignore[attr-defined]
        (frame,) = allowed.writer.frames  # type: ignore[attr-defined]
        cmd = decode_frame(frame[4:])
        assert (cmd.code, cmd.is_oneway, cmd.is_response) == (codes.CHECK_TRANSACTION_STATE, True, False)
        assert cmd.ext_fields == {"tranStateTableOffset": str(half.queue_offset), "commitLogOffset": str(half.physical_offset),
                                  "msgId": "UNIQ0003", "transactionId": "UNIQ0003", "offsetMsgId": half.offset_msg_id}
        assert decode_record(cmd.body).topic == "TxTopic"
        broker.connection_closed(allowed)
        assert not broker.ask_producer(half, req)

    _run(tmp_path, scenario)
