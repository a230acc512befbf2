"""Pipeline throughput on local[*]: reindex and export records/s over a generated store.

`.venv/bin/python -m bench pipeline [--records N] [--body-bytes N]`
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.runner import Result
from services.commitlog.message_input import NewMessage
from services.commitlog.store import CommitLogStore, StoreConfig


def _build_store(root: Path, records: int, body: int) -> None:
    store = CommitLogStore(StoreConfig(store_dir=root, segment_size=128 << 20, flush_interval_ms=60_000))
    for start in range(0, records, 2000):
        store.append_many([NewMessage(topic="PipeTopic", body=b"x" * body, keys=[f"order-{i}", f"cust-{i % 1000}"], unique_key=f"{i:032X}") for i in range(start, min(records, start + 2000))])
    store.close()


def run(argv: list[str]) -> list[Result]:
    from pipeline.cli import build_parser, run as run_job

    p = argparse.ArgumentParser(prog="python -m bench pipeline")
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--body-bytes", type=int, default=256)
    p.add_argument("--master", default="local[*]")
    args = p.parse_args(argv)
    out = []
    with tempfile.TemporaryDirectory(prefix="quarry-bench-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        _build_store(root / "store", args.records, args.body_bytes)
        params = {"records": args.records, "body_bytes": args.body_bytes, "master": args.master, "keys_per_record": 3}
        out.append(Result("generate store (in-process append)", args.records / (time.perf_counter() - t0), "records/s", params))
        for job, extra in (("reindex", ["--hash-slots", "5000000", "--index-num", str(args.records * 3 + 10)]), ("export", [])):
            t0 = time.perf_counter()
            summary = run_job(build_parser().parse_args([job, "--store", f"b={root / 'store'}", "--out", str(root / job), "--master", args.master, "--quiet", *extra]))
            elapsed = time.perf_counter() - t0
            assert summary.ok and summary.records == args.records
            out.append(Result(f"{job} records/s (incl. Spark start)", args.records / elapsed, "records/s", params))
            out.append(Result(f"{job} wall time", elapsed, "s", params))
    return out
