"""The indexer's gRPC servicer: QueryMessage and status over the IndexFile list.

It validates, asks the index for offsets and reads those records from its commitlog in one
call; it raises the services' errors, which services/status.py maps to status codes.
Formats live in `formats/`, storage in `index_store`. It serves on grpc.aio (as the commitlog
does): a query awaits its commitlog read on the event loop instead of holding a worker thread.
The Tail stream is followed by a task on the same loop (tailer.py); the index is shared under
`lock` with the filter builder's thread and the flushes, which run off the loop.
"""
from __future__ import annotations

import argparse
import gc
import logging
import os
import threading
import time
from pathlib import Path
from typing import AsyncIterator, Callable

import grpc

from quarry.channels import open_aio_channel

from quarry.formats import scheduled
from quarry.formats.index_keys import answers_key
from quarry.formats.topic import TopicError, validate_topic
from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, indexer_pb2, indexer_pb2_grpc
from quarry.services.commitlog.convert import to_stored
from quarry.services.commitlog.log_files import LogFiles
from quarry.services.indexer.checkpoint import ForeignStoreError, IndexCheckpoint, open_checkpoint, refuse_foreign
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
from quarry.services.errors import InvalidArgument, ReadOnly, Unavailable
from quarry.services.status import rpc_errors
from quarry.services.serving import Registration, aio_wait_for_termination, start_aio_server

log = logging.getLogger("quarry.indexer")

MAX_KEY_BYTES = 4096
DEFAULT_MAX_NUM = 64
UNIQUE_KEY_DEFAULT_MAX_NUM = 32  # the RocketMQ broker's default for unique-key queries


_MAX_RECEIVE = 128 * 1024 * 1024  # a page of records read from the commitlog


@rpc_errors
class IndexerServicer(indexer_pb2_grpc.IndexerServiceServicer):
    """QueryMessage + GetIndexStatus."""

    def __init__(self, broker_name: str, index: IndexStore, lock: threading.Lock, commitlog_addr: str, tailer: Tailer | None, checkpoint: IndexCheckpoint,
                 log_files: LogFiles | None = None, presence: KeyPresencePublisher | None = None) -> None:
        self.broker_name = broker_name
        self.presence = presence  # None: read-only or following a broker's index
        self.log_files = log_files  # the commitlog's segment files, when on this host
        self.index = index
        self.lock = lock
        self.tailer = tailer
        self.checkpoint = checkpoint
        self._channel = open_aio_channel(commitlog_addr, options=[("grpc.max_receive_message_length", _MAX_RECEIVE)])
        self._commitlog = commitlog_pb2_grpc.CommitLogServiceStub(self._channel)

    async def QueryMessage(self, request: indexer_pb2.QueryMessageRequest, context: grpc.aio.ServicerContext) -> indexer_pb2.QueryMessageResponse:
        try:
            validate_topic(request.topic)
        except TopicError as exc:
            raise InvalidArgument(str(exc)) from None
        if not request.key:
            raise InvalidArgument("key: must not be empty")
        if len(request.key.encode()) > MAX_KEY_BYTES:
            raise InvalidArgument(f"key: at most {MAX_KEY_BYTES} bytes")
        if request.max_num < 0:
            raise InvalidArgument("max_num: must be >= 0 (0 means the default)")
        if request.begin_timestamp < 0:
            raise InvalidArgument("begin_timestamp: must be >= 0")
        end = request.end_timestamp or int(time.time() * 1000)
        if request.begin_timestamp > end:
            raise InvalidArgument(f"begin_timestamp: must be <= end_timestamp ({end})")
        if request.before_phy_offset < 0:
            raise InvalidArgument("before_phy_offset: must be >= 0 (0 means no bound)")
        max_num = request.max_num or (UNIQUE_KEY_DEFAULT_MAX_NUM if request.unique_key_flag else DEFAULT_MAX_NUM)
        with self.lock:
            # Delayed messages parked before delivery are indexed under the parking topics.
            offsets, next_below = self.index.query_topics_page(
                scheduled.index_topics(request.topic), request.key, max_num, request.begin_timestamp, end, request.before_phy_offset or None
            )
            last_ts, last_off = self.index.last_update_timestamp, self.index.last_update_phy_offset
        response = indexer_pb2.QueryMessageResponse(
            index_last_update_timestamp=last_ts, index_last_update_phy_offset=last_off, next_before_phy_offset=next_below
        )
        if not offsets:
            return response
        if request.offsets_only:  # the caller reads the records (and checks their store times)
            response.physical_offsets.extend(offsets)
            return response
        begin = request.begin_timestamp
        # The index narrows to whole seconds; each record's own store time decides.
        if self.log_files is not None:
            records, rest = self.log_files.read(offsets)
            found = {r.physical_offset: to_stored(r, self.broker_name) for r in records if begin <= r.store_timestamp <= end}
        else:
            found, rest = {}, offsets
        if rest:  # not read from the files (or no files): the commitlog reads them
            remaining = context.time_remaining()
            try:
                got = await self._commitlog.GetMessages(
                    commitlog_pb2.GetMessagesRequest(physical_offsets=rest),
                    timeout=min(remaining, 5.0) if remaining is not None else 5.0,
                )
            except grpc.RpcError as exc:
                # Never an empty success when the messages cannot be read.
                raise Unavailable(f"commitlog of {self.broker_name} did not answer: {exc.code().name}: {exc.details()}") from None  # type: ignore[attr-defined]
            for msg in got.messages:
                if begin <= msg.store_timestamp <= end:
                    msg.broker_name = self.broker_name
                    found[msg.commit_log_offset] = msg
            response.unreadable_entries = len(got.not_found) + len(got.damaged)
            response.gone_offsets.extend(got.not_found)
            response.damaged_offsets.extend(got.damaged)
        # Newest index entry first, as the offsets came. The index answers by hash: a record of
        # another topic or key with the same hash never leaves (formats.index_keys.answers_key).
        for o in offsets:
            m = found.get(o)
            if m is None:
                continue
            if answers_key(m.topic, m.real_topic, m.keys, m.unique_key, request.topic, request.key, request.unique_key_flag):
                response.messages.append(m)
            else:
                response.collisions_filtered += 1
        return response

    async def GetIndexStatus(self, request: indexer_pb2.GetIndexStatusRequest, context: grpc.aio.ServicerContext) -> indexer_pb2.GetIndexStatusResponse:
        with self.lock:
            files = self.index.file_infos()
            problems = list(self.index.problems)
            last_ts, last_off = self.index.last_update_timestamp, self.index.last_update_phy_offset
            filter_pending, filter_bytes = len(self.index.filter_pending()), self.index.key_filter.memory_bytes()
        if self.tailer is not None and (stalled := self.tailer.progress.check()):
            problems.append(stalled)
        state = self.tailer.state if self.tailer else None
        checkpoint_offset = state.next_offset if state else self.checkpoint.offset
        max_offset = state.commitlog_max_offset if state else 0
        return indexer_pb2.GetIndexStatusResponse(
            broker_name=self.broker_name,
            files=[
                indexer_pb2.IndexFileInfo(
                    file_name=f.name,
                    begin_timestamp=f.begin_timestamp,
                    end_timestamp=f.end_timestamp,
                    begin_phy_offset=f.begin_phy_offset,
                    end_phy_offset=f.end_phy_offset,
                    hash_slot_count=f.hash_slot_count,
                    entries=f.entries,
                )
                for f in files
            ],
            total_entries=sum(f.entries for f in files),
            checkpoint_offset=checkpoint_offset,
            index_last_update_timestamp=last_ts,
            index_last_update_phy_offset=last_off,
            commitlog_max_offset=max_offset,
            lag_bytes=max(0, max_offset - checkpoint_offset),
            tail_connected=bool(state and state.connected),
            problems=problems,
            read_only=self.index.read_only,
            lag_ms=int(max(0, time.time() * 1000 - last_ts)) if state and max_offset > checkpoint_offset and last_ts else 0,
            max_files=self.index.config.max_files,
            key_filter_pending_files=filter_pending,
            key_filter_bytes=filter_bytes,
        )

    async def WatchKeyPresence(self, request: indexer_pb2.WatchKeyPresenceRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[indexer_pb2.WatchKeyPresenceResponse]:
        if self.presence is None:
            raise ReadOnly("key presence: not kept by a read-only indexer (--read-only, --follow-index): entries reach its files "
                           "without passing through it, so no copy of its filter could be kept current; ask it every key query")
        async for update in self.presence.watch():
            yield update

    async def close(self) -> None:
        await self._channel.close()


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
    running = await start_aio_server("indexer", args.bind, [Registration(lambda s: indexer_pb2_grpc.add_IndexerServiceServicer_to_server(servicer, s), name)],
                                     metrics=metrics.METRICS, health_check=lambda: tail_health(tailer) or (f"following the broker's index failed: {follower.failing}" if follower is not None and follower.failing else ""))
    # Start-up's objects (modules, descriptors, the opened index) live as long as the process:
    # frozen, a full collection no longer walks them with the loop stalled (as the commitlog).
    gc.collect()
    gc.freeze()

    def _stop() -> None:
        if follower is not None:
            follower.stop()
        if tailer is not None:
            tailer.stop()  # on the loop (this runs off it): flushes index, then checkpoint
        builder.stop()
        index.close()
        if lock_fd is not None:
            os.close(lock_fd)  # another indexer may write the directory now

    await aio_wait_for_termination(running, "indexer", on_stop=_stop, grace_s=args.shutdown_grace_ms / 1000.0,
                                   before_stop=presence.close if presence is not None else None)
    await servicer.close()
    return 0
