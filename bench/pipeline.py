"""Pipeline throughput: reindex records/s on local[1] and local[2] over the same store (the
scaling ratio), against the streaming indexer's own indexing rate, and export records/s.

Each job runs in a fresh process (a Spark session keeps its first master), as a user runs
it; rates are the job's own (summary) time, JVM start excluded and reported separately.
A cluster run is the same command with `--master spark://host:7077` (stores and --out on a
shared file system).

`.venv/bin/python -m bench pipeline [--records N] [--body-bytes N]`
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.runner import Result
from quarry.formats.dispatch import dispatch_info
from quarry.formats.segment_walk import walk_segments
from quarry.services.commitlog.storage.message_input import NewMessage
from quarry.services.commitlog.storage.store import CommitLogStore, StoreConfig
from quarry.services.indexer.index_store import IndexStore, IndexStoreConfig

SLOTS = 5_000_000


def _build_store(root: Path, records: int, body: int) -> None:
    store = CommitLogStore(StoreConfig(store_dir=root, segment_size=64 << 20, flush_interval_ms=60_000))
    for start in range(0, records, 2000):
        store.append_many([NewMessage(topic="PipeTopic", body=b"x" * body, keys=[f"order-{i}", f"cust-{i % 1000}"], unique_key=f"{i:032X}") for i in range(start, min(records, start + 2000))])
    store.close()


def _job(argv: list[str], summary: Path) -> tuple[dict, float]:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "quarry.pipeline", *argv, "--quiet", "--summary-json", str(summary)], check=True, capture_output=True)
    return json.loads(summary.read_text()), time.perf_counter() - t0


def _streaming_rate(store: Path, root: Path, index_num: int) -> float:
    """The streaming indexer's core: IndexStore.index_records over the log, batch by batch."""
    index = IndexStore.open(root / "stream-index", IndexStoreConfig(hash_slot_num=SLOTS, index_num=index_num))
    batch: list = []
    n = 0
    t0 = time.perf_counter()
    for rec in walk_segments(store / "commitlog"):
        batch.append(dispatch_info(rec))
        if len(batch) == 1024:
            index.index_records(batch)
            n += len(batch)
            batch = []
    index.index_records(batch)
    n += len(batch)
    elapsed = time.perf_counter() - t0
    index.close()
    return n / elapsed


def run(argv: list[str]) -> list[Result]:
    p = argparse.ArgumentParser(prog="python -m bench pipeline")
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--body-bytes", type=int, default=256)
    args = p.parse_args(argv)
    out: list[Result] = []
    index_num = args.records * 3 + 10
    with tempfile.TemporaryDirectory(prefix="quarry-bench-") as tmp:
        root = Path(tmp)
        _build_store(root / "store", args.records, args.body_bytes)
        params = {"records": args.records, "body_bytes": args.body_bytes, "keys_per_record": 3}
        rates = {}
        for master in ("local[1]", "local[2]"):
            summary, wall = _job(["reindex", "--store", f"b={root / 'store'}", "--out", str(root / f"rx-{master}"), "--master", master,
                                  "--hash-slots", str(SLOTS), "--index-num", str(index_num)], root / "s.json")
            rates[master] = summary["records_per_s"]
            out.append(Result(f"reindex records/s {master}", summary["records_per_s"], "records/s", {**params, "master": master}))
            out.append(Result(f"reindex wall time incl. JVM start {master}", wall, "s", {**params, "master": master}))
        out.append(Result("reindex scaling local[2]/local[1]", rates["local[2]"] / rates["local[1]"], "x", {**params, "target": ">= 1.6"}))
        stream = _streaming_rate(root / "store", root, index_num)
        out.append(Result("streaming indexer core records/s (one process)", stream, "records/s", params))
        out.append(Result("reindex local[2] / streaming indexer", rates["local[2]"] / stream, "x", params))
        summary, wall = _job(["export", "--store", f"b={root / 'store'}", "--out", str(root / "cat"), "--master", "local[2]"], root / "e.json")
        out.append(Result("export records/s local[2]", summary["records_per_s"], "records/s", {**params, "master": "local[2]"}))
    return out
