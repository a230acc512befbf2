"""Search-offset-by-time and the store-time browse over one store's ConsumeQueues."""
from __future__ import annotations

import os
import random
import time
import types
from pathlib import Path
from typing import Iterator

import pytest

from quarry.formats import tag_expression
from quarry.formats.java_hash import java_string_hash
from quarry.formats.scheduled import SCHEDULE_TOPIC
from quarry.services.commitlog.storage import browse as browse_mod
from quarry.services.commitlog.storage import append as append_mod
from quarry.services.commitlog.storage.browse import LOWER, UPPER, BrowseRequest, browse, search_offset_by_time
from quarry.services.commitlog.storage.errors import InvalidArgument, NotFound
from quarry.services.commitlog.storage.message_input import NewMessage
from quarry.services.commitlog.storage.store import CommitLogStore, StoreConfig


class Clock:
    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def time(self) -> float:
        return self.now_ms / 1000.0


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock(1_700_000_000_000)
    fake = types.SimpleNamespace(time=c.time, monotonic=time.monotonic, perf_counter=time.perf_counter)
    monkeypatch.setattr(append_mod, "time", fake)
    return c


@pytest.fixture
def store(tmp_path: Path, clock: Clock) -> Iterator[CommitLogStore]:
    s = CommitLogStore(StoreConfig(store_dir=tmp_path / "s", segment_size=1 << 20, default_queues=4, flush_interval_ms=10_000))
    yield s
    s.close()


def _send(store: CommitLogStore, clock: Clock, at_ms: int, topic: str = "T", queue_id: int = 0, tags: str = "", props: list[tuple[str, str]] | None = None, i: int = 0) -> None:
    clock.now_ms = at_ms
    store.append(NewMessage(topic=topic, body=f"m{i}".encode(), tags=tags, queue_id=queue_id, properties=props or []))


def _times(page: browse_mod.BrowsePage) -> list[int]:
    return [b.record.store_timestamp for b in page.records]


def test_search_offset_by_time_lower_and_upper_match_a_scan(store: CommitLogStore, clock: Clock) -> None:
    rng = random.Random(7)
    t = 1_700_000_000_000
    stamps = []
    for i in range(300):
        t += rng.choice([0, 0, 1, 5, 100])  # repeated store times, as RocketMQ's search must handle
        stamps.append(t)
        _send(store, clock, t, i=i)
    cq = store.cqs.existing("T", 0)
    assert cq is not None
    for probe in [stamps[0] - 1, stamps[-1] + 1] + rng.sample(stamps, 40) + [s + 1 for s in rng.sample(stamps, 20)]:
        lower = next((i for i, s in enumerate(stamps) if s >= probe), len(stamps))
        upper = max((i for i, s in enumerate(stamps) if s <= probe), default=-1)
        assert search_offset_by_time(store, cq, probe, LOWER) == lower, probe
        assert search_offset_by_time(store, cq, probe, UPPER) == upper, probe


def test_search_reads_a_logarithmic_number_of_records(store: CommitLogStore, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(4096):
        _send(store, clock, 1_700_000_000_000 + i, i=i)
    calls = []
    real = browse_mod.store_timestamp_at
    monkeypatch.setattr(browse_mod, "store_timestamp_at", lambda s, p, n: calls.append(p) or real(s, p, n))
    cq = store.cqs.existing("T", 0)
    assert search_offset_by_time(store, cq, 1_700_000_000_000 + 1234) == 1234
    assert len(calls) <= 13  # log2(4096) + 1


def test_bad_boundary_is_refused(store: CommitLogStore, clock: Clock) -> None:
    _send(store, clock, 1)
    with pytest.raises(InvalidArgument, match="boundary"):
        search_offset_by_time(store, store.cqs.existing("T", 0), 0, "MIDDLE")


def _fill(store: CommitLogStore, clock: Clock, n: int = 200) -> list[tuple[int, int]]:
    """n messages over 4 queues, store time 1000 + 10*i; returns (time, queue) per message."""
    base = 1_700_000_000_000
    out = []
    for i in range(n):
        q = (i * 7) % 4
        _send(store, clock, base + 10 * i, queue_id=q, tags="TagA" if i % 3 == 0 else "TagB", i=i)
        out.append((base + 10 * i, q))
    return out


def test_window_is_inclusive_and_ordered_both_ways(store: CommitLogStore, clock: Clock) -> None:
    sent = _fill(store, clock)
    begin, end = sent[20][0], sent[60][0]
    want = [t for t, _ in sent if begin <= t <= end]
    newest = browse(store, BrowseRequest("T", begin, end, tag_expression.MATCH_ALL, newest_first=True, max_count=1024, include_parked=False))
    oldest = browse(store, BrowseRequest("T", begin, end, tag_expression.MATCH_ALL, newest_first=False, max_count=1024, include_parked=False))
    assert _times(newest) == sorted(want, reverse=True)
    assert _times(oldest) == sorted(want)
    assert all(q.exhausted for q in newest.queues)


@pytest.mark.parametrize("newest_first", [True, False])
def test_cursors_page_through_the_same_sequence(store: CommitLogStore, clock: Clock, newest_first: bool) -> None:
    sent = _fill(store, clock)
    begin, end = sent[5][0], sent[190][0]
    full = _times(browse(store, BrowseRequest("T", begin, end, tag_expression.MATCH_ALL, newest_first, 1024, include_parked=False)))
    got: list[int] = []
    cursors: dict[tuple[str, int], int] = {}
    done: set[tuple[str, int]] = set()
    for _ in range(100):
        page = browse(store, BrowseRequest("T", begin, end, tag_expression.MATCH_ALL, newest_first, 7, dict(cursors), set(done), include_parked=False))
        got += _times(page)
        for b in page.records:  # consume everything: the next offset in the browse direction
            cursors[("T", b.record.queue_id)] = b.record.queue_offset + (-1 if newest_first else 1)
        done |= {(q.topic, q.queue_id) for q in page.queues if q.exhausted}
        if len(done) == 4:
            break
    assert got == full


def test_tag_filter_uses_codes_then_the_real_tag(store: CommitLogStore, clock: Clock) -> None:
    assert java_string_hash("Aa") == java_string_hash("BB")
    for i, tag in enumerate(["Aa", "BB", "Aa", "", "C"]):
        _send(store, clock, 1_700_000_000_000 + i, tags=tag, i=i)
    page = browse(store, BrowseRequest("T", 0, 2**62, tag_expression.parse("Aa"), max_count=100, include_parked=False))
    assert [b.record.tags for b in page.records] == ["Aa", "Aa"]
    page = browse(store, BrowseRequest("T", 0, 2**62, tag_expression.parse("C || BB"), max_count=100, include_parked=False))
    assert sorted(b.record.tags for b in page.records) == ["BB", "C"]


def test_parked_delayed_messages_are_browsed_under_their_real_topic(store: CommitLogStore, clock: Clock) -> None:
    base = 1_700_000_000_000
    _send(store, clock, base, i=0, tags="TagA")
    _send(store, clock, base + 5, topic=SCHEDULE_TOPIC, queue_id=2, tags="TagA",
          props=[("DELAY", "3"), ("REAL_TOPIC", "T"), ("REAL_QID", "1")], i=1)
    _send(store, clock, base + 6, topic=SCHEDULE_TOPIC, queue_id=2, tags="TagA",
          props=[("DELAY", "3"), ("REAL_TOPIC", "Other"), ("REAL_QID", "1")], i=2)
    page = browse(store, BrowseRequest("T", base, base + 100, tag_expression.parse("TagA"), max_count=100))
    assert [(b.queue_topic, b.record.body) for b in page.records] == [(SCHEDULE_TOPIC, b"m1"), ("T", b"m0")]
    page = browse(store, BrowseRequest("T", base, base + 100, tag_expression.parse("TagB"), max_count=100))
    assert page.records == []


def test_cost_depends_on_the_window_not_the_store(store: CommitLogStore, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(8000):
        _send(store, clock, 1_700_000_000_000 + i, queue_id=i % 4, i=i)
    reads = []
    real_read = store.read
    monkeypatch.setattr(store, "read", lambda phy: reads.append(phy) or real_read(phy))
    page = browse(store, BrowseRequest("T", 1_700_000_000_000 + 4000, 1_700_000_000_000 + 4009, tag_expression.MATCH_ALL, max_count=100, include_parked=False))
    assert len(page.records) == 10
    assert len(reads) == 10  # the search reads store times only; records are read for the window alone


def test_bad_requests_name_the_field(store: CommitLogStore, clock: Clock) -> None:
    _send(store, clock, 5)
    with pytest.raises(InvalidArgument, match="end_timestamp"):
        browse(store, BrowseRequest("T", 10, 5, tag_expression.MATCH_ALL))
    with pytest.raises(InvalidArgument, match="max_count"):
        browse(store, BrowseRequest("T", 0, 5, tag_expression.MATCH_ALL, max_count=0))
    with pytest.raises(NotFound, match="queue 9"):
        browse(store, BrowseRequest("T", 0, 5, tag_expression.MATCH_ALL, queue_ids=[9]))
    assert browse(store, BrowseRequest("Nope", 0, 5, tag_expression.MATCH_ALL)).records == []


@pytest.fixture
def small_segments(tmp_path: Path, clock: Clock) -> Iterator[CommitLogStore]:
    s = CommitLogStore(StoreConfig(store_dir=tmp_path / "small", segment_size=4096, default_queues=4, flush_interval_ms=10_000, file_reserved_hours=1.0))
    yield s
    s.close()


def _expire_oldest(store: CommitLogStore, segments: int) -> None:
    """Retention deletes the `segments` oldest segments: they are made older than the reserved hour."""
    store.flush()
    old = time.time() - 2 * 3600
    for seg in store.state.segments.segments[:segments]:
        os.utime(seg.path, (old, old))
    assert store.delete_expired(now_s=time.time()) == segments


def test_a_window_reaching_into_deleted_segments_names_what_is_gone(small_segments: CommitLogStore, clock: Clock) -> None:
    store = small_segments
    base = 1_700_000_000_000
    sent = []
    for i in range(200):
        clock.now_ms = base + 10 * i
        sent.append(store.append(NewMessage(topic="T", body=b"x" * 100, queue_id=i % 4)))
    assert len(store.state.segments.segments) >= 5
    _expire_oldest(store, 2)
    floor = store.min_offset
    live = [r for r in sent if r.physical_offset >= floor]
    assert floor > 0 and live and len(live) < len(sent)
    oldest_live = live[0].store_timestamp
    first_live = {q: min(r.queue_offset for r in live if r.queue_id == q) for q in range(4)}

    page = browse(store, BrowseRequest("T", base, base + 10_000, tag_expression.MATCH_ALL, newest_first=False, max_count=1024, include_parked=False))
    assert sorted(b.record.physical_offset for b in page.records) == [r.physical_offset for r in live]  # what is left, all of it
    assert page.gone is not None
    assert (page.gone.below_physical_offset, page.gone.stored_at_or_before) == (floor, oldest_live)
    assert [(g.topic, g.queue_id, g.first, g.end) for g in page.gone.queues] == [("T", q, 0, first_live[q]) for q in range(4)]

    # A window wholly in the deleted past: nothing returned, and said why.
    past = browse(store, BrowseRequest("T", base, base + 10, tag_expression.MATCH_ALL, max_count=10, include_parked=False))
    assert past.records == [] and past.gone is not None
    # One queue (printMsgByQueue): only that queue is named.
    one = browse(store, BrowseRequest("T", base, base + 10_000, tag_expression.MATCH_ALL, max_count=10, queue_ids=[2], include_parked=False))
    assert one.gone is not None and [(g.queue_id, g.end) for g in one.gone.queues] == [(2, first_live[2])]


def test_a_window_newer_than_the_oldest_readable_record_is_not_flagged(small_segments: CommitLogStore, clock: Clock) -> None:
    store = small_segments
    base = 1_700_000_000_000
    for i in range(200):
        clock.now_ms = base + 10 * i
        store.append(NewMessage(topic="T", body=b"x" * 100, queue_id=i % 4))
    untouched = browse(store, BrowseRequest("T", base, base + 10_000, tag_expression.MATCH_ALL, max_count=1024, include_parked=False))
    assert untouched.gone is None and len(untouched.records) == 200  # nothing deleted yet: nothing to say
    _expire_oldest(store, 2)
    oldest_live = store.read(store.min_offset).store_timestamp
    page = browse(store, BrowseRequest("T", oldest_live + 1, base + 10_000, tag_expression.MATCH_ALL, max_count=1024, include_parked=False))
    assert page.gone is None and page.records
    # Another topic with nothing in the deleted segments is not flagged either.
    clock.now_ms = base + 5_000
    store.append(NewMessage(topic="Fresh", body=b"y", queue_id=0))
    fresh = browse(store, BrowseRequest("Fresh", 0, base + 10_000, tag_expression.MATCH_ALL, max_count=10, include_parked=False))
    assert fresh.gone is None and len(fresh.records) == 1
