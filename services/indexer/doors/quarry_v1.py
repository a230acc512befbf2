"""The indexer's gRPC servicer: QueryMessage and status over the IndexFile list.

It validates, asks the index for offsets and reads those records from its commitlog in one
call; it raises the services' errors, which services/status.py maps to status codes.
Formats live in `formats/`, storage in `index_store`. It serves on grpc.aio (as the commitlog
does): a query awaits its commitlog read on the event loop instead of holding a worker thread.
The Tail stream is followed by a task on the same loop (tailer.py); the index is shared under
`lock` with the filter builder's thread and the flushes, which run off the loop.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import AsyncIterator

import grpc

from quarry.channels import open_aio_channel

from quarry.formats.index_keys import answers_key
from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, indexer_pb2, indexer_pb2_grpc
from quarry.services.stored_message import to_stored
from quarry.services.commitlog.storage.log_files import LogFiles
from quarry.services.indexer.checkpoint import IndexCheckpoint
from quarry.services.indexer.index_store import IndexStore
from quarry.services.indexer.index_view import query_offsets
from quarry.services.indexer.presence import KeyPresencePublisher
from quarry.services.indexer.tailer import Tailer
from quarry.services.errors import InvalidArgument, ReadOnly, Unavailable
from quarry.services.status import rpc_errors

log = logging.getLogger("quarry.indexer")

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
        if request.before_phy_offset < 0:
            raise InvalidArgument("before_phy_offset: must be >= 0 (0 means no bound)")
        end = request.end_timestamp or int(time.time() * 1000)
        with self.lock:
            # The rule is index_view.query_offsets, shared with the commitlog's read-only view.
            offsets, next_below = query_offsets(self.index, request.topic, request.key, request.max_num, request.begin_timestamp, end,
                                                request.unique_key_flag, request.before_phy_offset or None)
            last_ts, last_off, epoch = self.index.last_update_timestamp, self.index.last_update_phy_offset, self.index.epoch
        response = indexer_pb2.QueryMessageResponse(
            index_last_update_timestamp=last_ts, index_last_update_phy_offset=last_off, next_before_phy_offset=next_below, index_epoch=epoch
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
