"""Delay levels (RocketMQ 4.x): a message sent with one is parked under SCHEDULE_TOPIC_XXXX at
put time (services/commitlog/broker/parking.py) and stored again under its own topic and queue when
due (services/commitlog/broker/delayed_delivery.py), the cursors kept in config/delayOffset.json."""
from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any, Awaitable, Callable, TypeVar

import pytest

from quarry.formats.scheduled import DELAY_LEVEL_MS, SCHEDULE_TOPIC, schedule_of
from quarry.services.commitlog.broker.delayed_delivery import DelayedDelivery, load_offsets
from quarry.services.commitlog.storage.errors import InvalidArgument
from quarry.services.commitlog.broker.flush_signal import FlushSignal
from quarry.services.commitlog.storage.message_input import Host, NewMessage
from quarry.services.commitlog.broker.core import Broker
from quarry.services.commitlog.doors.quarry_v1 import CommitLogServicer
from quarry.services.commitlog.storage.store import CommitLogStore, StoreConfig
from quarry.v1 import common_pb2

T = TypeVar("T")
BORN = Host("10.0.0.7", 5000)


def _run(store_dir: Path, body: Callable[[CommitLogServicer, FlushSignal], Awaitable[T]], **config: Any) -> T:
    async def main() -> T:
        store = CommitLogStore(StoreConfig(store_dir=store_dir, **config))
        flushed = FlushSignal(asyncio.get_running_loop())
        store.add_flush_listener(flushed.fire)
        try:
            return await body(CommitLogServicer(Broker(store, "broker-a", threading.Event(), flushed)), flushed)
        finally:
            store.close()

    return asyncio.run(main())


def _delayed(level: str, key: str = "k", queue_id: int = 1, topic: str = "OrderTopic", **kw: Any) -> NewMessage:
    return NewMessage(topic, f"body-{key}".encode(), [key, "second"], "paid", f"U-{key}", [("a", "1"), ("DELAY", level)],
                      flag=7, queue_id=queue_id, born_timestamp=1_700_000_000_000, born_host=BORN, **kw)


def test_a_message_with_a_delay_level_is_parked_in_its_levels_queue(tmp_path: Path) -> None:
    async def body(servicer: CommitLogServicer, _: FlushSignal) -> None:
        row = (await servicer.sending.append_flushed([_delayed("3")])).rows[0]
        # (row: physical offset, size, topic, queue, queue offset, tagsCode, ..., store time)
        assert (row[2], row[3], row[4]) == (SCHEDULE_TOPIC, 2, 0)
        assert row[5] == row[8] + DELAY_LEVEL_MS[2]  # the queue's tagsCode is the deliver time
        rec = servicer.store.read(row[0])
        assert rec.properties["REAL_TOPIC"] == "OrderTopic" and rec.properties["REAL_QID"] == "1" and rec.properties["DELAY"] == "3"
        assert rec.properties["KEYS"] == "k second" and rec.properties["UNIQ_KEY"] == "U-k"
        assert servicer.store.topics[SCHEDULE_TOPIC] == 18  # a queue per level, as RocketMQ's
        assert servicer.store.topics["OrderTopic"] == 4  # made by the send, as any message's topic ...
        assert all(not servicer.store.pull("OrderTopic", q, 0, 10)[0] for q in range(4))  # ... and empty until it is due

    _run(tmp_path, body)


@pytest.mark.parametrize("level, sys_flag", [("0", 0), ("-2", 0), ("soon", 0), ("", 0), ("3", 0x4), ("3", 0xC)])
def test_no_level_and_prepared_or_rolled_back_records_are_stored_where_sent(tmp_path: Path, level: str, sys_flag: int) -> None:
    async def body(servicer: CommitLogServicer, _: FlushSignal) -> str:
        return str((await servicer.sending.append_flushed([_delayed(level, sys_flag=sys_flag)])).rows[0][2])

    assert _run(tmp_path, body) == "OrderTopic"


def test_levels_past_the_last_are_the_last_and_the_broker_chooses_the_real_queue_in_turn(tmp_path: Path) -> None:
    async def body(servicer: CommitLogServicer, _: FlushSignal) -> list[tuple[int, str, str]]:
        # quarry.v1's protobuf messages, queue left to the broker
        msgs = [common_pb2.MessageInput(topic="OrderTopic", body=b"x", queue_id=-1, properties=[common_pb2.Property(name="DELAY", value="99")])
                for _ in range(3)]
        appended = await servicer.sending.append_flushed(msgs, peer=("10.1.1.1", 9))
        return [(row[3], (p := servicer.store.read(row[0]).properties)["REAL_QID"], p["DELAY"]) for row in appended.rows]

    # The level stored is the last one, as RocketMQ stores it.
    assert _run(tmp_path, body, default_queues=4) == [(17, "0", "18"), (17, "1", "18"), (17, "2", "18")]


@pytest.mark.parametrize("msg, field", [
    (_delayed("2", topic="bad topic"), "topic"),
    (_delayed("2", queue_id=9), "queue_id"),
    (_delayed("2", queue_id=-5), "queue_id"),
    (NewMessage("OrderTopic", b"", ["k"], properties=[("DELAY", "2")], queue_id=0, born_host=BORN), "body"),
])
def test_a_delayed_message_is_checked_against_its_own_topic(tmp_path: Path, msg: NewMessage, field: str) -> None:
    async def body(servicer: CommitLogServicer, _: FlushSignal) -> None:
        with pytest.raises(InvalidArgument) as err:
            await servicer.sending.append_flushed([msg])
        assert err.value.field == field
        assert servicer.store.write_offset == 0 and set(servicer.store.topics) <= {SCHEDULE_TOPIC}  # no topic of the refused message

    _run(tmp_path, body, default_queues=4)


def test_a_batch_of_delayed_messages_still_holds_one_topic(tmp_path: Path) -> None:
    async def body(servicer: CommitLogServicer, _: FlushSignal) -> None:
        with pytest.raises(InvalidArgument) as err:
            await servicer.sending.append_flushed([_delayed("2"), _delayed("2", topic="OtherTopic")])
        assert err.value.field == "messages[1].topic"

    _run(tmp_path, body)


def test_each_level_is_delivered_when_due_and_its_cursor_kept(tmp_path: Path) -> None:
    now = [0]

    async def body(servicer: CommitLogServicer, flushed: FlushSignal) -> None:
        store = servicer.store
        late = (await servicer.sending.append_flushed([_delayed("2", "late")])).rows[0]  # 5 s
        early = (await servicer.sending.append_flushed([_delayed("1", "early", queue_id=3)])).rows[0]  # 1 s, sent after
        delivery = DelayedDelivery(servicer.sending, flushed, clock_ms=lambda: now[0])
        now[0] = early[8] + 999
        assert await delivery.deliver_due() == 0
        now[0] = early[8] + 1000
        assert await delivery.deliver_due() == 1
        records, _, _, _ = store.pull("OrderTopic", 3, 0, 10)
        assert [r.properties["UNIQ_KEY"] for r in records] == ["U-early"]
        copy = records[0]
        assert copy.body == b"body-early" and copy.flag == 7 and copy.born_timestamp == 1_700_000_000_000 and copy.born_host == BORN
        # As RocketMQ stores the copy: its level kept (read as delivered: it carries REAL_TOPIC).
        assert copy.properties == {"KEYS": "early second", "TAGS": "paid", "UNIQ_KEY": "U-early", "a": "1", "DELAY": "1",
                                   "REAL_TOPIC": "OrderTopic", "REAL_QID": "3"}
        assert schedule_of(copy.topic, copy.properties, copy.store_timestamp) is None and copy.prepared_transaction_offset == 0
        assert store.flushed_offset >= store.write_offset  # on disk before the cursor moved
        assert json.loads((tmp_path / "config" / "delayOffset.json").read_text()) == {"offsetTable": {"1": 1}}
        now[0] = late[8] + 5000
        assert await delivery.deliver_due() == 1
        assert [r.properties["UNIQ_KEY"] for r in store.pull("OrderTopic", 1, 0, 10)[0]] == ["U-late"]
        assert await delivery.deliver_due() == 0  # delivered once
        # A restart goes on from the kept cursors: nothing is delivered twice.
        again = DelayedDelivery(servicer.sending, flushed, clock_ms=lambda: now[0])
        assert again.offsets == {1: 1, 2: 1} and await again.deliver_due() == 0

    _run(tmp_path, body)


def _hand_parked(sending: Any, key: str, real_topic: str, real_qid: str) -> Any:
    """Sent straight to the parking topic, as a RocketMQ broker stores a delayed message."""
    return sending.append_flushed([NewMessage(SCHEDULE_TOPIC, b"x", [key], "", f"U-{key}", [("DELAY", "1"), ("REAL_TOPIC", real_topic), ("REAL_QID", real_qid)],
                                              queue_id=0, born_host=BORN)])


def test_a_copy_goes_where_it_can_and_a_record_naming_nowhere_is_passed(tmp_path: Path) -> None:
    async def body(servicer: CommitLogServicer, flushed: FlushSignal) -> list[tuple[str, int]]:
        sending = servicer.sending
        sending.store.create_topic("OrderTopic", 4)
        for key, topic, qid in (("a", "OrderTopic", "0"), ("gone", "OrderTopic", "7"), ("new", "NewTopic", "1"), ("loop", SCHEDULE_TOPIC, "0"),
                                ("half", "RMQ_SYS_TRANS_HALF_TOPIC", "0"), ("noqid", "OrderTopic", "x"), ("badname", "bad topic", "0")):
            await _hand_parked(sending, key, topic, qid)
        delivery = DelayedDelivery(sending, flushed, clock_ms=lambda: 2**62)
        assert await delivery.deliver_due() == 3
        assert delivery.offsets == {1: 7}
        assert await delivery.deliver_due() == 0  # nothing comes back: a copy is never parked again
        store = sending.store
        return sorted((r.properties["UNIQ_KEY"], r.queue_id) for t in ("OrderTopic", "NewTopic") for q in range(store.topics[t])
                      for r in store.pull(t, q, 0, 10)[0])

    # Queue 7 of 4 is folded onto those left; a topic that is gone is made again (auto-creation
    # off: the message was taken when sent); no copy goes to a parking or transaction topic.
    assert _run(tmp_path, body, auto_create_topics=False) == [("U-a", 0), ("U-gone", 3), ("U-new", 1)]


def test_cursors_are_written_only_once_the_copies_are_on_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from quarry.services.commitlog.broker import delayed_delivery

    monkeypatch.setattr(delayed_delivery, "FLUSH_WAIT_S", 0.05)

    async def body(servicer: CommitLogServicer, flushed: FlushSignal) -> None:
        store = servicer.store
        await _hand_parked(servicer.sending, "a", "OrderTopic", "0")
        store.flush()
        monkeypatch.setattr(store.flusher, "request_flush", lambda *a: None)  # a disk that does not keep up
        delivery = DelayedDelivery(servicer.sending, flushed, clock_ms=lambda: 2**62)
        assert await delivery.deliver_due() == 1
        assert delivery.offsets == {1: 1} and not delivery.path.exists()  # the copy is not on disk yet
        assert await delivery.deliver_due() == 0  # and is not stored a second time meanwhile
        store.flush()
        await delivery.deliver_due()
        assert load_offsets(delivery.path) == {1: 1}

    _run(tmp_path, body, flush_interval_ms=120_000)


def test_rocketmqs_own_delay_offset_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "delayOffset.json"
    path.write_text('{"offsetTable":{1:5,3:0,18:12}}')  # fastjson's bare integer keys
    assert load_offsets(path) == {1: 5, 3: 0, 18: 12}
    path.write_text('{"offsetTable": {"2": 4}}')
    assert load_offsets(path) == {2: 4}


def test_a_unit_due_later_than_its_levels_delay_from_now_is_due_now(tmp_path: Path) -> None:
    """A clock set back after the store (or a record sent to another level's queue) would hold
    its whole level: RocketMQ delivers such a unit at once, and so does Quarry."""
    now = [0]

    async def body(servicer: CommitLogServicer, flushed: FlushSignal) -> list[str]:
        sending = servicer.sending
        # Level 18 (2 h) sent straight into level 1's queue, ahead of a level-1 message.
        await sending.append_flushed([NewMessage(SCHEDULE_TOPIC, b"x", ["far"], "", "U-far", [("DELAY", "18"), ("REAL_TOPIC", "T"), ("REAL_QID", "0")],
                                                 queue_id=0, born_host=BORN)])
        near = (await _hand_parked(sending, "near", "T", "0")).rows[0]
        delivery = DelayedDelivery(sending, flushed, clock_ms=lambda: now[0])
        now[0] = near[8] + 1000  # level 1 due; "far" is 2 h ahead, more than level 1's delay
        assert await delivery.deliver_due() == 2
        return [r.properties["UNIQ_KEY"] for r in sending.store.pull("T", 0, 0, 10)[0]]

    assert _run(tmp_path, body) == ["U-far", "U-near"]


def test_a_copy_sent_again_with_a_level_is_parked_once_more_without_repeating_its_real_topic(tmp_path: Path) -> None:
    async def body(servicer: CommitLogServicer, _: FlushSignal) -> list[tuple[str, str]]:
        # What a 4.x client's retry of a delivered copy sends: its properties, REAL_* included.
        msg = NewMessage("OrderTopic", b"x", ["k"], properties=[("REAL_TOPIC", "OrderTopic"), ("REAL_QID", "3"), ("DELAY", "2")], queue_id=1, born_host=BORN)
        row = (await servicer.sending.append_flushed([msg])).rows[0]
        return [(n, v) for n, v in servicer.store.read(row[0]).properties_pairs if n.startswith("REAL")]

    assert _run(tmp_path, body) == [("REAL_TOPIC", "OrderTopic"), ("REAL_QID", "1")]


@pytest.mark.parametrize("topic, props, held", [
    ("T", {"DELAY": "3", "REAL_TOPIC": "T", "REAL_QID": "0"}, False),  # a delivered copy (RocketMQ keeps DELAY in it)
    ("T", {"DELAY": "3"}, True),  # a store that did not park it
    ("T", {"DELAY": "3", "REAL_TOPIC": "Other"}, True),  # REAL_TOPIC naming another topic: not a copy of this one
    ("T", {"TIMER_DELIVER_MS": str(2**50)}, True),  # a RocketMQ 5 delivery time
])
def test_a_delivered_copy_is_due_at_once_and_the_others_when_their_time_comes(topic: str, props: dict[str, str], held: bool) -> None:
    from quarry.formats.scheduled import due_at

    assert (due_at(topic, props, 1_000) is not None) is held


def test_a_cursor_past_its_queues_end_reads_the_queue_again(tmp_path: Path) -> None:
    """(An edited file, a rebuilt queue.) Delivered twice rather than not at all."""
    async def body(servicer: CommitLogServicer, flushed: FlushSignal) -> list[str]:
        sending = servicer.sending
        (tmp_path / "config").mkdir(exist_ok=True)
        (tmp_path / "config" / "delayOffset.json").write_text('{"offsetTable": {"1": 50}}')
        await _hand_parked(sending, "a", "T", "0")
        delivery = DelayedDelivery(sending, flushed, clock_ms=lambda: 2**62)
        assert await delivery.deliver_due() == 1 and delivery.offsets == {1: 1}
        return [r.properties["UNIQ_KEY"] for r in sending.store.pull("T", 0, 0, 10)[0]]

    assert _run(tmp_path, body) == ["U-a"]


def test_a_level_that_cannot_be_read_is_said_once_and_does_not_stop_the_others(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                                caplog: pytest.LogCaptureFixture) -> None:
    async def body(servicer: CommitLogServicer, flushed: FlushSignal) -> list[str]:
        sending = servicer.sending
        await _hand_parked(sending, "a", "T", "0")  # level 1
        await sending.append_flushed([NewMessage(SCHEDULE_TOPIC, b"x", ["b"], "", "U-b", [("DELAY", "2"), ("REAL_TOPIC", "T"), ("REAL_QID", "1")],
                                                 queue_id=1, born_host=BORN)])  # level 2
        cq = sending.store.cqs.existing(SCHEDULE_TOPIC, 0)
        monkeypatch.setattr(cq, "read_units", lambda *a: (_ for _ in ()).throw(OSError(5, "Input/output error")))
        delivery = DelayedDelivery(sending, flushed, clock_ms=lambda: 2**62)
        for _ in range(3):
            await delivery.deliver_due()
        monkeypatch.undo()
        assert await delivery.deliver_due() == 1  # level 1 readable again
        return sorted(r.properties["UNIQ_KEY"] for q in range(2) for r in sending.store.pull("T", q, 0, 10)[0])

    with caplog.at_level("INFO", logger="quarry.commitlog.delayed"):
        assert _run(tmp_path, body) == ["U-a", "U-b"]
    said = [r.getMessage() for r in caplog.records if "not readable" in r.getMessage() or "readable again" in r.getMessage()]
    assert len(said) == 2, said  # once when it failed, once when it came back: not every round


def test_a_dead_letter_copy_of_a_delivered_copy_is_not_held_again() -> None:
    from quarry.formats.record import Record
    from quarry.formats.scheduled import due_at
    from quarry.services.commitlog.doors.rmq5_consume import dead_letter_copy

    rec = Record(0, 0, 0, 0, 0, 0, 0, 1_000, Host("10.0.0.1", 1), 1_000, Host("10.0.0.2", 2), 0, 0, b"x", "T",
                 "DELAY\x0118\x02REAL_TOPIC\x01T\x02REAL_QID\x010\x02UNIQ_KEY\x01U-1")
    copy = dead_letter_copy(rec, "g", 16)
    props = dict(copy.properties)
    assert "DELAY" not in props and "REAL_TOPIC" not in props
    assert due_at(copy.topic, props, 1_000) is None
