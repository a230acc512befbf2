"""`export`: decode every record into a Parquet catalog partitioned by broker, topic and store date."""
from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import Any, Iterable, Iterator

from quarry.pipeline import catalog
from quarry.pipeline.corrupt import CorruptPolicy
from quarry.pipeline.jobs import JobContext, JobError, describe_inputs, distribute, open_inputs, plan_splits
from quarry.pipeline.planning import Split
from quarry.pipeline.progress import StageCounters, human_bytes
from quarry.pipeline.reader import SplitWalker


def export_rows(splits: Iterable[Split], with_body: bool, policy: CorruptPolicy, counters: StageCounters | None = None) -> Iterator[tuple[Any, ...]]:
    """Task side: the catalog rows of the splits' records, in log order."""
    for split in splits:
        walker = SplitWalker(split, policy, counters=counters)
        for rec in walker:
            yield catalog.row(rec, split.broker, with_body)
        res = walker.result
        if counters is not None:
            counters.records.add(res.records)
            counters.bytes.add(res.bytes)
            if res.corrupt:
                counters.corrupt.add((len(res.corrupt), list(res.corrupt)))


def records_dataframe(ctx: JobContext, splits: list[Split], with_body: bool, counters: StageCounters | None) -> Any:
    """The catalog of the splits as a DataFrame (lazy: nothing is read until an action)."""
    rdd = distribute(ctx, splits).mapPartitions(partial(export_rows, with_body=with_body, policy=ctx.policy, counters=counters))
    return ctx.spark.createDataFrame(rdd, catalog.schema(with_body), verifySchema=False)


def _catalog_files(out: Path) -> tuple[int, int, int]:
    """(parquet files, bytes, partition directories) under a catalog directory."""
    files = size = 0
    leaves = set()
    for root, _dirs, names in os.walk(out):
        for n in names:
            if n.endswith(".parquet"):
                files += 1
                size += os.path.getsize(os.path.join(root, n))
                leaves.add(root)
    return files, size, len(leaves)


def run_export(ctx: JobContext) -> None:
    args = ctx.args
    stores = open_inputs(args)
    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and not args.overwrite:
        raise JobError(f"--out {out}: exists and is not empty (use --overwrite to replace it)", usage=True)
    ctx.summary.inputs = describe_inputs(stores)
    splits = plan_splits(ctx, stores)
    counters = ctx.counters()
    df = records_dataframe(ctx, splits, args.with_body, counters)
    if args.one_file_per_partition:
        df = df.repartition(*catalog.PARTITION_COLUMNS)
    writer = df.write.partitionBy(*catalog.PARTITION_COLUMNS).mode("overwrite" if args.overwrite else "errorifexists")
    total = sum(s.total_bytes for s in stores)
    ctx.run_stage("decode+write", counters, total, lambda: writer.parquet(str(out)))
    ctx.collect(counters, "corrupt records (not exported)")
    files, size, partitions = _catalog_files(out)
    ctx.summary.files = files
    ctx.summary.output = str(out)
    ctx.summary.details.append(
        ("catalog", f"{partitions:,} broker/topic/store_date partitions, {human_bytes(size)} of Parquet, body {'included' if args.with_body else 'not included (--with-body)'}")
    )
