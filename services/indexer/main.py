"""The indexer process: its index store, the tailer (or the follower of a RocketMQ store's own
IndexFiles), key presence and its quarry.v1 door, built by constructor on one event loop."""
from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable

import grpc



from quarry.v1 import indexer_pb2, indexer_pb2_grpc
from quarry.services.commitlog.storage.log_files import LogFiles
from quarry.services.indexer.checkpoint import ForeignStoreError, open_checkpoint, refuse_foreign
from quarry.services.indexer.index_store import IndexStore, IndexStoreConfig
from quarry.services.indexer import metrics
from quarry.services.indexer.filter_builder import FilterBuilder
from quarry.services.indexer.presence import KeyPresencePublisher
from quarry.services.indexer.index_follow import IndexFollower
from quarry.services.indexer.tailer import Tailer, TailState
from quarry.services import event_loop
from quarry.formats.dir_lock import DirLockError
from quarry.formats.index_checkpoint import lock_index_dir
from quarry.services.log import configure_logging, log_event
from quarry.services.metrics import StartupError
from quarry.services.settings import metrics_host
from quarry.services.progress import Watches
from quarry.services.serving import Registration, aio_wait_for_termination, start_aio_server
from quarry.services.call_tracking import CallTracker
from quarry.services.frames_server import announced, start_frames

from quarry.services.indexer.doors.quarry_v1 import IndexerServicer

log = logging.getLogger("quarry.indexer")

def serve(args: argparse.Namespace) -> int:
    configure_logging(args.log_format, args.log_level)
    try:
        return event_loop.run(_serve(args), args.event_loop)
    except (ForeignStoreError, StartupError, DirLockError) as exc:
        log_event(log, "refusing to start", logging.ERROR, reason=str(exc))
        return 2


def _under(lock: threading.Lock, read: Callable[[], int]) -> int:
    """A gauge read from the metrics thread: the index's file list changes under `lock`."""
    with lock:
        return read()


def tail_health(tailer: Tailer | None) -> str:
    """"" while the Tail stream is connected and indexing keeps up or progresses (or there is no
    tail: read-only), else why not."""
    if tailer is None:
        return ""
    if not tailer.state.connected:
        return f"no Tail connection to the commitlog {tailer.commitlog_addr}: {tailer.state.last_error or 'connecting'}"
    return tailer.progress.check()


def _log_files(store_dir: str) -> LogFiles | None:
    """The commitlog's segment files for key queries to read (--commitlog-store-dir), or None."""
    if not store_dir:
        return None
    if not (Path(store_dir) / "commitlog").is_dir():
        raise StartupError(f"--commitlog-store-dir [env QUARRY_COMMITLOG_STORE_DIR]: {store_dir} holds no commitlog/ directory (give the commitlog's --store-dir, on this host)")
    return LogFiles(Path(store_dir))


async def _serve(args: argparse.Namespace) -> int:
    index_dir = Path(args.index_dir)
    log_files = _log_files(args.commitlog_store_dir)  # a wrong directory stops the start
    lock_fd = None
    if not args.read_only:
        refuse_foreign(index_dir)  # before anything is made there, the lock included
        index_dir.mkdir(parents=True, exist_ok=True)
        lock_fd = lock_index_dir(index_dir, "--index-dir [env QUARRY_INDEX_DIR]")  # before the checkpoint may be migrated
    checkpoint = open_checkpoint(index_dir, read_only=args.read_only)
    # Then the metrics port: a taken one stops the process before the index is opened.
    metrics.METRICS.serve(args.metrics_port, metrics_host(args))
    config = IndexStoreConfig(
        hash_slot_num=args.hash_slots, index_num=args.index_num, max_msgs_num_batch=args.max_msgs_num_batch,
        read_only=args.read_only, max_files=args.max_files,
    )
    index = IndexStore.open(index_dir / "index", config)
    for problem in index.problems:
        log_event(log, "index problem", logging.WARNING, problem=problem)
    if checkpoint.problem:
        index.problems.append(checkpoint.problem)
    lock = threading.Lock()
    # Filters of the files found on open are built in the background: queries walk a file
    # until its filter is published, so the indexer serves at once.
    builder = FilterBuilder(index, lock).start()
    metrics.KEY_FILTER_BYTES.set_function(index.key_filter.memory_bytes)
    metrics.KEY_FILTER_PENDING.set_function(lambda: _under(lock, lambda: len(index.filter_pending())))
    tailer, presence = None, None
    if not args.read_only:
        start = checkpoint.offset
        if index.rebuild_from is not None and index.rebuild_from < start:
            log_event(log, "re-indexing after corrupt index files", logging.WARNING, from_offset=index.rebuild_from, checkpoint=start)
            start = index.rebuild_from
        log_event(log, "index opened", dir=str(index_dir), files=len(index.file_infos()), checkpoint=start, last_indexed=index.last_update_phy_offset)
        def _observe(records: int, state: "TailState") -> None:
            metrics.INDEX_LAG_BYTES.set(max(0, state.commitlog_max_offset - state.next_offset))
            behind = state.commitlog_max_offset > state.next_offset
            metrics.INDEX_LAG_SECONDS.set(max(0.0, time.time() - state.last_store_timestamp / 1000.0) if behind and state.last_store_timestamp else 0)

        # Key presence only where every entry passes through the tailer, which tells the
        # watchers each batch's keys as it writes it (presence.py).
        presence = KeyPresencePublisher(index, lock).start()
        tailer = Tailer(args.commitlog, index, checkpoint, start, flush_interval_ms=args.flush_interval_ms, lock=lock, on_batch=_observe,
                        presence=presence).start()
    follower = IndexFollower(index, lock, args.follow_interval_ms).start() if args.follow_index else None
    if tailer is not None:
        Watches().register(metrics.METRICS.registry).add(tailer.progress)
    metrics.TAIL_CONNECTED.set_function(lambda: 1.0 if tailer is not None and tailer.state.connected else 0.0)
    servicer = IndexerServicer(args.broker_name, index, lock, args.commitlog, tailer, checkpoint, log_files, presence)
    name = indexer_pb2.DESCRIPTOR.services_by_name["IndexerService"].full_name
    tracker = CallTracker(metrics.METRICS)
    # The router's unary calls may also come as frames (services/frames_server.py).
    def add_door(s: grpc.aio.Server) -> None:
        indexer_pb2_grpc.add_IndexerServiceServicer_to_server(servicer, s)
    frames = await start_frames("indexer", args.frames_port, args.bind, [add_door], tracker, 128 * 1024 * 1024)
    running = await start_aio_server("indexer", args.bind, [Registration(announced(add_door, frames), name)],
                                     metrics=metrics.METRICS, tracker=tracker, health_check=lambda: tail_health(tailer) or (f"following the broker's index failed: {follower.failing}" if follower is not None and follower.failing else ""))
    # Start-up's objects (modules, descriptors, the opened index) live as long as the process:
    # frozen, a full collection no longer walks them with the loop stalled (as the commitlog).
    gc.collect()
    gc.freeze()

    loop = asyncio.get_running_loop()

    def _stop() -> None:
        if frames is not None:  # calls still running after the grace end before the index closes
            asyncio.run_coroutine_threadsafe(frames.close(), loop).result()
        if follower is not None:
            follower.stop()
        if tailer is not None:
            tailer.stop()  # on the loop (this runs off it): flushes index, then checkpoint
        builder.stop()
        index.close()
        if lock_fd is not None:
            os.close(lock_fd)  # another indexer may write the directory now

    def _before_grace() -> None:
        if frames is not None:
            frames.stop_accepting()
        if presence is not None:
            presence.close()

    await aio_wait_for_termination(running, "indexer", on_stop=_stop, grace_s=args.shutdown_grace_ms / 1000.0, before_stop=_before_grace)
    await servicer.close()
    return 0
