"""`reindex`: rebuild a broker's IndexFiles from its CommitLog segments, in parallel.

Each task walks one contiguous offset range (a split) and writes its own IndexFiles, named
so that file order is log order; the driver then writes the checkpoint at the end of the
last split. `python -m quarry.services.indexer --index-dir OUT/<broker>` opens the result and
continues tailing from the checkpoint: no gap, nothing indexed twice. Indexing follows the
indexer exactly (the same IndexFile code and key rules): UNIQ_KEY and every KEYS token as
`topic#key`, rollback records skipped.
"""
from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Iterable, Iterator

from quarry.formats.index_file import IndexFile
from quarry.formats.java_hash_batch import index_key_hashes
from quarry.formats.dispatch import dispatch_info
from quarry.formats.index_checkpoint import FILE_NAME as CHECKPOINT_FILE
from quarry.formats.dir_lock import DirLockError
from quarry.formats.index_checkpoint import LOCK_NAME, foreign_files, lock_index_dir, save_index_checkpoint
from quarry.formats.index_keys import index_file_name, index_names, is_indexed
from quarry.pipeline.corrupt import CorruptPolicy
from quarry.pipeline.jobs import JobContext, JobError, describe_inputs, distribute, open_inputs, plan_splits
from quarry.pipeline.planning import Split
from quarry.pipeline.progress import StageCounters, human_bytes
from quarry.pipeline.reader import SplitWalker

FILES_PER_SPLIT = 1000  # name slots per split: file names are base + split index * 1000 + n (ms)
BATCH = 4096


@dataclass
class SplitIndex:
    """What one task wrote."""

    split_index: int
    broker: str
    files: list[str] = field(default_factory=list)
    entries: int = 0
    end_offset: int = 0
    last_store_timestamp: int = 0


def _name(base_ms: int, split_index: int, n: int) -> str:
    if n >= FILES_PER_SPLIT:
        raise ValueError(f"split {split_index} needs more than {FILES_PER_SPLIT} IndexFiles: use smaller splits")
    return index_file_name(base_ms + split_index * FILES_PER_SPLIT + n)


def index_splits(splits: Iterable[Split], out: str, slots: int, index_num: int, base_ms: int, policy: CorruptPolicy, counters: StageCounters | None = None) -> Iterator[SplitIndex]:
    """Task side: index each split into IndexFiles of its own under OUT/<broker>/index/."""
    for split in splits:
        result = SplitIndex(split.index, split.broker)
        directory = Path(out) / split.broker / "index"
        current: IndexFile | None = None
        pending: list[tuple[str, int, int]] = []

        def flush_pending() -> None:
            nonlocal current, pending
            hashed = [(h, off, ts) for h, (_, off, ts) in zip(index_key_hashes([n for n, _, _ in pending]), pending)]
            while hashed:
                if current is None or current.is_write_full():
                    if current is not None:
                        current.flush()
                        current.close()
                    name = _name(base_ms, split.index, len(result.files))
                    current = IndexFile(directory / name, slots, index_num)
                    result.files.append(name)
                done = current.put_keys(hashed)
                result.entries += done
                hashed = hashed[done:]
            pending = []

        walker = SplitWalker(split, policy, counters=counters)
        for rec in walker:
            info = dispatch_info(rec)
            if not is_indexed(info.sys_flag):
                continue
            pending.extend((name, info.physical_offset, info.store_timestamp) for name in index_names(info.topic, info.keys, info.unique_key))
            if len(pending) >= BATCH:
                flush_pending()
        if pending:
            flush_pending()
        if current is not None:
            current.flush()
            current.close()
        res = walker.result
        result.end_offset = res.end_offset
        result.last_store_timestamp = res.last_store_timestamp
        if counters is not None:
            counters.records.add(res.records)
            counters.bytes.add(res.bytes)
            if res.corrupt:
                counters.corrupt.add((len(res.corrupt), list(res.corrupt)))
        yield result


def run_reindex(ctx: JobContext) -> None:
    locks: list[int] = []
    try:
        _reindex(ctx, locks)
    finally:
        for fd in locks:
            os.close(fd)


def _reindex(ctx: JobContext, locks: list[int]) -> None:
    args = ctx.args
    stores = open_inputs(args)
    out = Path(args.out)
    for store in stores:
        target = out / store.broker
        if target.exists() and any(target.iterdir()):
            if foreign := foreign_files(target):
                raise JobError(f"--out {target}: holds files Quarry did not create ({'; '.join(foreign)}); not touched", usage=True)
            if not args.overwrite and any(p.name != LOCK_NAME for p in target.iterdir()):
                raise JobError(f"--out {target}: exists and is not empty (use --overwrite to replace it)", usage=True)
        # Held to the end: an indexer writing the directory refuses to start meanwhile, and one
        # already writing it stops this job before anything is removed.
        target.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            locks.append(lock_index_dir(target, f"--out {target}"))
        except DirLockError as exc:
            raise JobError(str(exc), usage=True) from None
        for entry in target.iterdir():  # (--overwrite, checked above) all but the lock just taken
            if entry.name == LOCK_NAME:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        (target / "index").mkdir(parents=True, exist_ok=True, mode=0o700)
    ctx.summary.inputs = describe_inputs(stores)
    splits = plan_splits(ctx, stores)
    counters = ctx.counters()
    base_ms = int(time.time() * 1000) // 1000 * 1000
    task = partial(index_splits, out=str(out), slots=args.hash_slots, index_num=args.index_num, base_ms=base_ms, policy=ctx.policy, counters=counters)
    total = sum(s.total_bytes for s in stores)
    results: list[SplitIndex] = ctx.run_stage("decode+index", counters, total, lambda: distribute(ctx, splits).mapPartitions(task).collect())
    ctx.collect(counters, "corrupt records (not indexed)")
    entries = 0
    for store in stores:
        mine = sorted((r for r in results if r.broker == store.broker), key=lambda r: r.split_index)
        last = mine[-1] if mine else SplitIndex(-1, store.broker)
        stamp = max((r.last_store_timestamp for r in mine), default=0)
        save_index_checkpoint(out / store.broker / CHECKPOINT_FILE, last.end_offset, stamp)
        files = sum(len(r.files) for r in mine)
        entries += sum(r.entries for r in mine)
        ctx.summary.details.append((store.broker, f"{files} IndexFiles, {sum(r.entries for r in mine):,} entries, checkpoint {last.end_offset} → start the indexer with --index-dir {out / store.broker}"))
    ctx.summary.files = sum(len(r.files) for r in results)
    ctx.summary.output = str(out)
    ctx.summary.details.append(("index", f"{entries:,} entries, {args.hash_slots:,} slots × {args.index_num:,} entries per file, {human_bytes(total)} of segments read"))
