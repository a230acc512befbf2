"""Browse pages across brokers: merged in store-time order, complete across pages, retried
pages after a broker failure. Two real stores stand in for two brokers' commitlogs."""
from __future__ import annotations

import asyncio
import os
import random
import threading
import time
import types
from pathlib import Path
from typing import Iterator

import pytest

from quarry.formats import tag_expression
from quarry.services.commitlog.storage import append as append_mod
from quarry.services.commitlog.storage.browse import BrowseRequest, browse
from quarry.services.commitlog.storage.message_input import NewMessage
from quarry.services.stored_message import to_stored
from quarry.services.commitlog.broker.core import Broker as CommitLogBroker
from quarry.services.commitlog.broker.flush_signal import FlushSignal
from quarry.services.commitlog.doors.quarry_v1 import CommitLogServicer
from quarry.services.commitlog.storage.store import CommitLogStore, StoreConfig
from quarry.services.query.browse_pages import BadBrowseTokenError, BrokerPlace, BrowseToken, decode_token, encode_token, merge_page
from quarry.services.query.queries import Queries, QuerySettings
from quarry.services.query.registry import Broker, BrokerRegistry
from quarry.services.query.doors.quarry_v1 import QueryRouterServicer
from quarry.v1 import commitlog_pb2, common_pb2, router_pb2


class Clock:
    now_ms = 1_700_000_000_000

    def time(self) -> float:
        return self.now_ms / 1000.0


@pytest.fixture
def stores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[dict[str, CommitLogStore], list[tuple[int, str, int]]]]:
    clock = Clock()
    monkeypatch.setattr(append_mod, "time", types.SimpleNamespace(time=clock.time, monotonic=time.monotonic, perf_counter=time.perf_counter))
    brokers = {name: CommitLogStore(StoreConfig(store_dir=tmp_path / name, segment_size=1 << 20, default_queues=3, flush_interval_ms=10_000))
               for name in ("broker-a", "broker-b")}
    rng = random.Random(3)
    sent = []
    t = clock.now_ms
    for i in range(400):
        t += rng.choice([0, 1, 3])  # equal store times on both brokers too
        clock.now_ms = t
        name = rng.choice(sorted(brokers))
        brokers[name].append(NewMessage(topic="T", body=f"m{i}".encode(), queue_id=rng.randrange(3), tags=rng.choice(["A", "B"])))
        sent.append((t, name, i))
    yield brokers, sent
    for s in brokers.values():
        s.close()


def _answer(store: CommitLogStore, name: str, place: BrokerPlace, begin: int, end: int, tags: str, oldest_first: bool, max_num: int) -> commitlog_pb2.BrowseMessagesResponse:
    page = browse(store, BrowseRequest("T", begin, end, tag_expression.parse(tags), not oldest_first, max_num, dict(place.cursors), set(place.done)))
    return commitlog_pb2.BrowseMessagesResponse(
        messages=[to_stored(b.record, name) for b in page.records],
        queues=[commitlog_pb2.BrowseQueueState(topic=q.topic, queue_id=q.queue_id, window_begin_offset=q.window_begin, window_end_offset=q.window_end, exhausted=q.exhausted) for q in page.queues],
    )


def _walk(brokers: dict[str, CommitLogStore], begin: int, end: int, tags: str, oldest_first: bool, max_num: int, fail: dict[int, str] | None = None) -> tuple[list[bytes], int]:
    token = BrowseToken("d", end, {n: BrokerPlace() for n in brokers})
    got: list[bytes] = []
    pages = 0
    while True:
        down = (fail or {}).get(pages)
        answers = {n: _answer(s, n, token.brokers[n], begin, end, tags, oldest_first, max_num) for n, s in brokers.items() if n != down and not token.brokers[n].finished}
        page = merge_page(answers, token, max_num, oldest_first)
        if down is not None:
            # The page is incomplete: the client sends the same token again once the broker is back.
            answers = {n: _answer(s, n, token.brokers[n], begin, end, tags, oldest_first, max_num) for n, s in brokers.items() if not token.brokers[n].finished}
            page = merge_page(answers, token, max_num, oldest_first)
        assert len(page.messages) <= max_num
        got += [m.body for m in page.messages]
        pages += 1
        token = decode_token(encode_token(page.token), "d")
        if not page.more:
            return got, pages
        assert pages < 1000


@pytest.mark.parametrize("oldest_first", [False, True])
@pytest.mark.parametrize("max_num", [1, 7, 64, 1024])
def test_pages_cover_the_window_once_in_store_time_order(stores: tuple[dict[str, CommitLogStore], list[tuple[int, str, int]]], oldest_first: bool, max_num: int) -> None:
    brokers, sent = stores
    begin, end = sent[30][0], sent[350][0]
    inside = [(t, n, i) for t, n, i in sent if begin <= t <= end]
    got, pages = _walk(brokers, begin, end, "", oldest_first, max_num)
    assert sorted(got) == sorted(f"m{i}".encode() for _, _, i in inside)
    times = {f"m{i}".encode(): t for t, _, i in sent}
    order = [times[b] for b in got]
    assert order == sorted(order, reverse=not oldest_first)
    if max_num < len(inside):
        assert pages >= len(inside) // max_num


def test_tag_filter_across_brokers(stores: tuple[dict[str, CommitLogStore], list[tuple[int, str, int]]]) -> None:
    brokers, sent = stores
    got, _ = _walk(brokers, 0, 2**62, "B", False, 10)
    want = []
    for name, s in brokers.items():
        want += [r.body for q in range(3) for r in s.pull("T", q, 0, 1000)[0] if r.tags == "B"]
    assert sorted(got) == sorted(want)


def test_a_failed_broker_keeps_its_place_and_the_retried_page_is_the_same(stores: tuple[dict[str, CommitLogStore], list[tuple[int, str, int]]]) -> None:
    brokers, sent = stores
    clean, _ = _walk(brokers, 0, 2**62, "", False, 16)
    retried, _ = _walk(brokers, 0, 2**62, "", False, 16, fail={2: "broker-b", 5: "broker-a"})
    assert retried == clean


def test_empty_window_has_no_more_pages(stores: tuple[dict[str, CommitLogStore], list[tuple[int, str, int]]]) -> None:
    brokers, _ = stores
    got, pages = _walk(brokers, 1, 2, "", False, 10)
    assert got == [] and pages == 1


def test_token_is_bound_to_its_browse() -> None:
    text = encode_token(BrowseToken("abc", 5, {"b": BrokerPlace({("T", 1): 4}, {("T", 0)}, False)}))
    assert decode_token(text, "abc").brokers["b"].cursors == {("T", 1): 4}
    with pytest.raises(BadBrowseTokenError, match="another topic"):
        decode_token(text, "xyz")
    with pytest.raises(BadBrowseTokenError, match="not a browse token"):
        decode_token("garbage!", "abc")


def test_a_page_ends_before_it_outgrows_a_grpc_message(monkeypatch: pytest.MonkeyPatch) -> None:
    from quarry.services.query import browse_pages

    monkeypatch.setattr(browse_pages, "MAX_PAGE_BYTES", 250)
    msgs = [common_pb2.StoredMessage(topic="T", queue_id=0, queue_offset=i, store_timestamp=100 + i, store_size=100, body=b"x") for i in range(5)]
    answer = commitlog_pb2.BrowseMessagesResponse(messages=msgs, queues=[commitlog_pb2.BrowseQueueState(topic="T", queue_id=0, exhausted=True)])
    page = merge_page({"b": answer}, BrowseToken("d", 0, {"b": BrokerPlace()}), 64, True)
    assert [m.queue_offset for m in page.messages] == [0, 1]
    assert page.more and page.token.brokers["b"].cursors == {("T", 0): 2}
    assert ("T", 0) not in page.token.brokers["b"].done  # three returned messages were not taken


class ServicerClients:
    """The router's broker channels, answered in process by each broker's commitlog servicer."""

    def __init__(self, servicers: dict[str, CommitLogServicer]) -> None:
        self.servicers = servicers

    def commitlog(self, address: str) -> types.SimpleNamespace:
        servicer = self.servicers[address]
        return types.SimpleNamespace(BrowseMessages=lambda request, timeout: servicer.BrowseMessages(request, None))  # type: ignore[arg-type]


def test_a_broker_whose_retention_deleted_part_of_the_window_makes_the_answer_incomplete(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(append_mod, "time", types.SimpleNamespace(time=clock.time, monotonic=time.monotonic, perf_counter=time.perf_counter))
    base = clock.now_ms
    stores = {name: CommitLogStore(StoreConfig(store_dir=tmp_path / name, segment_size=4096, default_queues=2, flush_interval_ms=10_000, file_reserved_hours=1.0))
              for name in ("broker-a", "broker-b")}
    try:
        for i in range(120):
            clock.now_ms = base + 10 * i
            stores["broker-a" if i % 2 else "broker-b"].append(NewMessage(topic="T", body=b"x" * 100, queue_id=i % 4 // 2))
        a = stores["broker-a"]
        a.flush()
        old = time.time() - 2 * 3600
        for seg in a.state.segments.segments[:2]:
            os.utime(seg.path, (old, old))
        assert a.delete_expired(now_s=time.time()) == 2
        floor, oldest = a.min_offset, a.read(a.min_offset).store_timestamp

        async def page(begin: int, token: str = "", max_num: int = 1024) -> router_pb2.BrowseTopicResponse:
            flushed = FlushSignal(asyncio.get_running_loop())
            servicers = {name: CommitLogServicer(CommitLogBroker(s, name, threading.Event(), flushed)) for name, s in stores.items()}
            registry = BrokerRegistry(expiry_ms=60_000)
            for name in stores:
                registry.register(Broker(name, commitlog_addr=name, indexer_addr="", store_host=f"{name}:10911", topics={"T": 2}))
            queries = Queries(registry, ServicerClients(servicers), QuerySettings(), clock_ms=lambda: base + 100_000)  # type: ignore[arg-type]
            router = QueryRouterServicer(registry, queries)
            return await router.BrowseTopic(router_pb2.BrowseTopicRequest(topic="T", begin_timestamp=begin, end_timestamp=base + 10_000, oldest_first=True,
                                                                          max_num=max_num, continuation_token=token), None)  # type: ignore[arg-type]

        first = asyncio.run(page(base, max_num=10))
        assert not first.result.complete and all(b.answered for b in first.result.brokers)
        (gone,) = first.expired
        assert (gone.broker_name, gone.from_physical_offset, gone.to_physical_offset, gone.stored_at_or_before) == ("broker-a", 0, floor, oldest)
        live = {q: min(m.queue_offset for m in a.pull("T", q, 0, 1000)[0]) for q in range(2)}
        assert [(q.topic, q.queue_id, q.from_queue_offset, q.to_queue_offset) for q in gone.queues] == [("T", q, 0, live[q]) for q in range(2)]
        (note,) = first.result.notes
        assert note.startswith("broker broker-a: messages of this window may be gone") and f"[0, {floor})" in note and "T/0 [0, " in note
        # The browse goes on past the loss: the next page still says what is gone.
        second = asyncio.run(page(base, token=first.result.next_continuation_token, max_num=10))
        assert [g.broker_name for g in second.expired] == ["broker-a"] and not second.result.complete
        # A window newer than broker-a's oldest readable record misses nothing.
        newer = asyncio.run(page(oldest + 1))
        assert newer.result.complete and not newer.expired and not newer.result.notes and newer.result.messages
    finally:
        for s in stores.values():
            s.close()
