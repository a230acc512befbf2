"""Browse a 1-minute store-time window on stores of 100 k and 1 M messages: the time should be
flat (set by the window, not the store), against a baseline taken in the same run: finding the
same window by reading every unit's store time from the queue start (what a browse without
search-offset-by-time would do).

Stores are built with the store module directly (the real append path, in batches), its clock
stepped 10 s per batch of 1,000, so every store holds 100 messages per second of store time
and the window holds 6,000 messages whatever the store's size.

`.venv/bin/python -m bench browse [--sizes 100000,1000000] [--repeat 5]`
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
import types
from pathlib import Path

from bench.runner import Result
from quarry.clients.admin import AdminClient
from quarry.formats import tag_expression
from quarry.services.commitlog.storage import append as append_mod
from quarry.services.commitlog.storage.browse import BrowseRequest, browse, store_timestamp_at
from quarry.services.commitlog.storage.message_input import NewMessage
from quarry.services.commitlog.storage.store import CommitLogStore, StoreConfig
from scripts.launcher import ServiceProcess, free_port

BASE_MS = 1_700_000_000_000
BATCH = 1000
STEP_MS = 10_000  # store time advanced per batch: 100 messages per second
WINDOW_MS = 60_000
QUEUES = 4
TOPIC = "BrowseBench"


class _Clock:
    def __init__(self) -> None:
        self.now_ms = BASE_MS

    def time(self) -> float:
        return self.now_ms / 1000.0


def build(root: Path, n: int) -> None:
    """n messages of 256-byte bodies over 4 queues, 100 per second of store time."""
    clock = _Clock()
    real = append_mod.time
    append_mod.time = types.SimpleNamespace(time=clock.time, monotonic=time.monotonic, perf_counter=time.perf_counter)  # type: ignore[assignment]
    try:
        store = CommitLogStore(StoreConfig(store_dir=root, segment_size=256 << 20, default_queues=QUEUES, flush_interval_ms=60_000))
        body = b"x" * 256
        for start in range(0, n, BATCH):
            store.append_many([NewMessage(topic=TOPIC, body=body, keys=[f"k{start + i}"], tags="TagA" if i % 2 else "TagB",
                                          queue_id=(start + i) % QUEUES) for i in range(min(BATCH, n - start))])
            clock.now_ms += STEP_MS
        store.close()
    finally:
        append_mod.time = real  # type: ignore[assignment]


def window(n: int) -> tuple[int, int]:
    """A minute in the middle of the store's time span."""
    mid = BASE_MS + (n // BATCH // 2) * STEP_MS
    return mid, mid + WINDOW_MS - 1


def browse_all(store: CommitLogStore, begin: int, end: int) -> int:
    """Every message of the window, newest first, in pages of 1,024 resumed by cursors."""
    cursors: dict[tuple[str, int], int] = {}
    done: set[tuple[str, int]] = set()
    count = 0
    while True:
        page = browse(store, BrowseRequest(TOPIC, begin, end, tag_expression.MATCH_ALL, True, 1024, dict(cursors), set(done), include_parked=False))
        count += len(page.records)
        for b in page.records:
            cursors[(b.queue_topic, b.record.queue_id)] = b.record.queue_offset - 1
        done |= {(q.topic, q.queue_id) for q in page.queues if q.exhausted}
        if len(done) >= len(page.queues):
            return count


def scan_baseline(store: CommitLogStore, begin: int, end: int) -> int:
    """The window found by reading every unit's store time from each queue's start."""
    count = 0
    for q in range(QUEUES):
        cq = store.cqs.existing(TOPIC, q)
        assert cq is not None
        offset = cq.min_offset
        while offset < cq.max_offset:
            units = cq.read_units(offset, 4096)
            for phy, size, _ in units:
                ts = store_timestamp_at(store, phy, size)
                if ts is not None and begin <= ts <= end:
                    count += 1
            offset += len(units)
    return count


def _median_s(fn, repeat: int) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    times, got = [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        got = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), got


def _through_router(root: Path, store_dir: Path, begin: int, end: int, repeat: int) -> tuple[float, int]:
    router = ServiceProcess("router", f"127.0.0.1:{free_port()}", ["--heartbeat-interval-ms", "500"], root / "logs" / "router.log").start()
    addr = f"127.0.0.31:{free_port('127.0.0.31')}"
    commitlog = ServiceProcess("commitlog", addr, ["--store-dir", str(store_dir), "--broker-name", "broker-a", "--router", router.address,
                                                   "--heartbeat-interval-ms", "500", "--segment-size", str(256 << 20)], root / "logs" / "commitlog.log").start()
    try:
        with AdminClient(router.address) as admin:
            deadline = time.monotonic() + 30
            while TOPIC not in admin.topics() and time.monotonic() < deadline:
                time.sleep(0.05)  # bench setup, not a test: the broker's first heartbeat

            def run() -> int:
                token, count = "", 0
                while True:
                    r = admin.browse_topic(TOPIC, begin, end, max_num=1024, continuation_token=token)
                    assert r.complete
                    count += len(r.messages)
                    token = r.next_token
                    if not token:
                        return count

            return _median_s(run, repeat)
    finally:
        commitlog.stop()
        router.stop()


def run(argv: list[str]) -> list[Result]:
    p = argparse.ArgumentParser(prog="bench browse")
    p.add_argument("--sizes", default="100000,1000000")
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    results: list[Result] = []
    browse_s: dict[int, float] = {}
    root = Path(tempfile.mkdtemp(prefix="quarry-bench-browse-"))
    try:
        for n in sizes:
            store_dir = root / f"store-{n}"
            t0 = time.perf_counter()
            build(store_dir, n)
            built_s = time.perf_counter() - t0
            begin, end = window(n)
            store = CommitLogStore(StoreConfig(store_dir=store_dir, segment_size=256 << 20, read_only=True))
            try:
                b_s, got = _median_s(lambda: browse_all(store, begin, end), args.repeat)
                s_s, scanned = _median_s(lambda: scan_baseline(store, begin, end), 1)
            finally:
                store.close()
            assert got == scanned, (got, scanned)  # 6,000 once the store spans more than a minute of store time
            r_s, via_router = _through_router(root / f"svc-{n}", store_dir, begin, end, args.repeat)
            assert via_router == got
            browse_s[n] = b_s
            params = {"store_messages": n, "window_messages": got, "window": "1 min", "page": 1024, "repeat": args.repeat}
            results += [
                Result("store built (append module, batches of 1000)", n / built_s, "msg/s", {"store_messages": n}),
                Result("browse 1-minute window, store module", b_s * 1000, "ms", params),
                Result("browse 1-minute window, CLI path (router + commitlog over gRPC)", r_s * 1000, "ms", params),
                Result("baseline: same window by scanning store times from queue start", s_s * 1000, "ms", {**params, "repeat": 1}),
                Result("baseline / browse", s_s / b_s, "x", {"store_messages": n}),
            ]
        if len(sizes) >= 2:
            small, large = sizes[0], sizes[-1]
            results.append(Result(f"browse time {large // 1000}k / {small // 1000}k store", browse_s[large] / browse_s[small], "x",
                                  {"store_ratio": large / small, "flat_means": "about 1"}))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return results
