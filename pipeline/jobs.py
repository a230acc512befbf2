"""What every job shares: the Spark session, the stores, the plan, progress and the summary."""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from quarry.pipeline.corrupt import CorruptPolicy, CorruptRecordError, from_spark_error
from quarry.pipeline.planning import Split, auto_split_bytes, describe_plan, per_segment_plan, plan_from_cuts, scan_cuts
from quarry.pipeline.progress import Progress, StageCounters, human_bytes
from quarry.pipeline.stores import Store, StoreError, open_stores
from quarry.pipeline.summary import Summary


class JobError(Exception):
    """A job that cannot run or did not finish; `usage` marks bad arguments (exit 2)."""

    def __init__(self, message: str, usage: bool = False) -> None:
        super().__init__(message)
        self.usage = usage


@dataclass
class JobContext:
    args: argparse.Namespace
    spark: Any
    progress: Progress
    summary: Summary
    policy: CorruptPolicy
    started: float = field(default_factory=time.monotonic)

    @property
    def sc(self) -> Any:
        return self.spark.sparkContext

    @property
    def parallelism(self) -> int:
        return max(1, int(self.sc.defaultParallelism))

    def counters(self) -> StageCounters:
        return StageCounters.create(self.sc, self.progress.live_address())

    def collect(self, counters: StageCounters, skipped_label: str) -> None:
        """Fold a stage's task counters (records, bytes, corrupt reports) into the summary."""
        count, reports = counters.corrupt.value
        self.summary.records = counters.records.value
        self.summary.bytes = counters.bytes.value
        self.summary.corrupt = sorted(reports, key=lambda r: (r.broker, r.offset))
        self.summary.corrupt_count = count
        if count:
            self.summary.skipped[skipped_label] = count

    def run_stage(self, name: str, counters: StageCounters | None, total_bytes: int, action: Callable[[], Any]) -> Any:
        """Run a Spark action as a named stage; a task's CorruptRecordError comes back as itself."""
        with self.progress.stage(name, counters, total_bytes):
            try:
                return action()
            except CorruptRecordError:
                raise
            except Exception as exc:  # Spark wraps task errors (Py4JJavaError, PythonException, …)
                corrupt = from_spark_error(exc)
                if corrupt is not None:
                    raise corrupt from None
                raise


def open_inputs(args: argparse.Namespace) -> list[Store]:
    try:
        stores = open_stores(args.store)
    except StoreError as exc:
        raise JobError(str(exc), usage=True) from exc
    for store in stores:
        if not store.segments:
            raise JobError(f"--store {store.broker}: {store.commitlog_dir} holds no segment files", usage=True)
    return stores


def describe_inputs(stores: list[Store]) -> list[str]:
    lines = [
        f"{len(stores)} broker(s), {sum(len(s.segments) for s in stores)} segments, {human_bytes(sum(s.total_bytes for s in stores))}"
    ]
    for s in stores:
        lines.append(f"{s.broker}: {len(s.segments)} segments, {human_bytes(s.total_bytes)} in {s.commitlog_dir}")
    return lines


def plan_splits(ctx: JobContext, stores: list[Store]) -> list[Split]:
    """A task per segment, or finer: cut at record boundaries by a parallel header pass."""
    args = ctx.args
    split_bytes = 0 if args.per_segment else (args.split_bytes or auto_split_bytes(stores, ctx.parallelism))
    if split_bytes <= 0:
        splits = per_segment_plan(stores)
    else:
        big = [seg for store in stores for seg in store.segments if seg.file_size > split_bytes]
        cuts = {}
        if big:
            counters = ctx.counters()

            def scan(seg: Any) -> Any:
                result = scan_cuts(seg, split_bytes)
                counters.records.add(result.records_seen)
                counters.bytes.add(seg.file_size)
                return result

            found = ctx.run_stage(
                "plan",
                counters,
                sum(s.file_size for s in big),
                lambda: ctx.sc.parallelize(big, len(big)).map(scan).collect(),
            )
            cuts = {c.path: c for c in found}
        splits = plan_from_cuts(stores, cuts)
    ctx.summary.details.append(("plan", describe_plan(splits) + (f", cut every ~{human_bytes(split_bytes)}" if split_bytes else "")))
    return splits


def distribute(ctx: JobContext, splits: list[Split]) -> Any:
    """An RDD with one split per partition, the largest first (they are scheduled in order)."""
    ordered = sorted(splits, key=lambda s: (-s.nominal_bytes, s.index))
    return ctx.sc.parallelize(ordered, max(1, len(ordered)))
