"""The RocketMQ 4 door's message queries: QUERY_MESSAGE (by key, through this broker's
indexer, as the gRPC queries do, or from its IndexFiles mapped read-only in this process
when they are on this host: commitlog --index-dir), VIEW_MESSAGE_BY_ID and SEARCH_OFFSET_BY_TIMESTAMP. Records go
out as the bytes stored (what MessageDecoder decodes)."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Protocol

import grpc

from quarry.channels import open_aio_channel
from quarry.formats.index_keys import answers_key
from quarry.formats.properties import KEYS, REAL_TOPIC, UNIQ_KEY, key_tokens, properties_map
from quarry.services.commitlog.storage.browse import search_offset_by_time
from quarry.services.commitlog.storage.errors import StoreError
from quarry.services.commitlog.storage.store import CommitLogStore
from quarry.services.errors import InvalidArgument, Unavailable
from quarry.services.log import log_event
from quarry.services.remoting import codes
from quarry.services.remoting.command import JAVA_INT, RemotingCommand
from quarry.services.remoting.server import Connection, RemotingError
from quarry.v1 import indexer_pb2, indexer_pb2_grpc

UNIQUE_KEY_QUERY_MAX_NUM = 32  # RocketMQ's defaultQueryMaxNum, used for unique-key queries

log = logging.getLogger("quarry.commitlog.remoting")


class KeyIndex(Protocol):
    """This broker's IndexFiles read in this process (the composition root builds it:
    services/indexer/index_view.py). `answer` gives the offsets by the indexer's rule (defaults,
    cap, parking topics) and the index's last update (time, physical offset); it raises
    Unavailable when it may answer less than the indexer would, or InvalidArgument."""

    def answer(self, topic: str, key: str, max_num: int, begin: int, end: int, unique: bool = False) -> tuple[list[int], int, int]: ...


class Queries:
    """The door's query handlers (a mixin of RemotingBroker, remoting.py, whose constructor sets
    the state below)."""

    store: CommitLogStore
    _indexer_addr: str
    _indexer: indexer_pb2_grpc.IndexerServiceStub | None
    _indexer_channel: grpc.aio.Channel | None
    _key_index: KeyIndex | None
    _key_index_failing: str

    def _record_bytes(self, physical_offset: int) -> bytes:
        return self.store.read_bytes(physical_offset)[1]

    def view_message(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        offset = req.integer("offset")
        try:
            return req.response(codes.SUCCESS, body=self._record_bytes(offset))
        except StoreError as exc:
            raise RemotingError(codes.SYSTEM_ERROR, f"can not find message by the offset, {offset}: {exc}") from None

    def query_message(self, req: RemotingCommand, conn: Connection) -> RemotingCommand | Awaitable[RemotingCommand]:
        """QUERY_MESSAGE: the records the indexer's entries for topic/key (a unique key with the
        flag) point at, read from this store. The IndexFiles read in this process answer the
        positions when there are (--index-dir: answered at once), else the indexer does
        (offsets_only: no second read of each record in its process); the exact-match rule and
        each record's own store time are applied here, so a hash collision is never handed out."""
        unique = req.ext_fields.get(codes.UNIQUE_KEY_QUERY_FLAG) == "true"
        topic, key = req.text("topic"), req.text("key")
        max_num = UNIQUE_KEY_QUERY_MAX_NUM if unique else req.integer("maxNum", lo=0, hi=JAVA_INT[1])
        begin, end_given = max(0, req.integer("beginTimestamp")), req.integer("endTimestamp")
        end = end_given or int(time.time() * 1000)
        answer = self._query_key_index(topic, key, max_num, begin, end, unique)
        if answer is None:
            return self._query_indexer(req, indexer_pb2.QueryMessageRequest(
                topic=topic, key=key, max_num=max_num, begin_timestamp=begin, end_timestamp=end_given, unique_key_flag=unique, offsets_only=True))
        return self._key_answer(req, *answer, topic, key, begin, end, unique)

    async def _query_indexer(self, req: RemotingCommand, request: indexer_pb2.QueryMessageRequest) -> RemotingCommand:
        if not self._indexer_addr:
            raise RemotingError(codes.SYSTEM_ERROR, "this broker has no indexer configured (--indexer-addr): key queries cannot be answered")
        try:
            reply = await self._indexer_stub().QueryMessage(request, timeout=10.0)
        except grpc.RpcError as exc:
            raise RemotingError(codes.SYSTEM_ERROR, f"indexer {self._indexer_addr}: {exc.code().name}: {exc.details()}") from None  # type: ignore[attr-defined]
        end = request.end_timestamp or int(time.time() * 1000)
        return self._key_answer(req, list(reply.physical_offsets), reply.index_last_update_timestamp, reply.index_last_update_phy_offset,
                                request.topic, request.key, request.begin_timestamp, end, request.unique_key_flag)

    def _key_answer(self, req: RemotingCommand, offsets: list[int], last_ts: int, last_off: int,
                    topic: str, key: str, begin: int, end: int, unique: bool) -> RemotingCommand:
        """The response: the records at `offsets` (newest entry first) that hold the key and
        were stored in [begin, end]."""
        fields = {"indexLastUpdateTimestamp": last_ts, "indexLastUpdatePhyoffset": last_off}
        body = []
        for offset in offsets:
            try:
                record_topic, stored_at, properties_text, stored = self.store.read_key_fields(offset)
            except StoreError:
                continue  # expired (or damaged) between the index read and now
            # The index holds whole seconds and answers by hash: the record itself decides.
            if begin <= stored_at <= end:
                props = properties_map(properties_text)
                if answers_key(record_topic, props.get(REAL_TOPIC), key_tokens(props.get(KEYS)), props.get(UNIQ_KEY), topic, key, unique):
                    body.append(stored)
        if not body:
            return req.response(codes.QUERY_NOT_FOUND, "can not find message, maybe time range not correct", fields)
        return req.response(codes.SUCCESS, None, fields, b"".join(body))

    def _query_key_index(self, topic: str, key: str, max_num: int, begin: int, end: int, unique: bool) -> tuple[list[int], int, int] | None:
        """(offsets, last update time, offset) from the IndexFiles read here, or None: no view,
        or it may answer less than the indexer (said in the log when that starts and ends)."""
        if self._key_index is None:
            return None
        try:
            answer = self._key_index.answer(topic, key, max_num, begin, end, unique)
        except Unavailable as exc:
            if not self._key_index_failing:
                log_event(log, "key queries ask the indexer: the index files read here may be behind", logging.WARNING, reason=str(exc))
            self._key_index_failing = str(exc)
            return None
        except InvalidArgument as exc:
            raise RemotingError(codes.SYSTEM_ERROR, f"index: {exc}") from None
        if self._key_index_failing:
            log_event(log, "key queries answered from the index files read here again")
            self._key_index_failing = ""
        return answer

    def _indexer_stub(self) -> indexer_pb2_grpc.IndexerServiceStub:
        """The indexer's stub on an asyncio channel, opened in this loop at the first query."""
        if self._indexer is None:
            self._indexer_channel = open_aio_channel(self._indexer_addr)
            self._indexer = indexer_pb2_grpc.IndexerServiceStub(self._indexer_channel)
        return self._indexer

    async def search_offset(self, req: RemotingCommand, conn: Connection) -> RemotingCommand:
        topic, queue_id, ts = req.text("topic"), req.integer("queueId", lo=0, hi=JAVA_INT[1]), req.integer("timestamp")
        cq = self.store.cqs.existing(topic, queue_id)
        offset = await asyncio.to_thread(search_offset_by_time, self.store, cq, ts) if cq is not None else 0
        return req.response(codes.SUCCESS, None, {"offset": offset})
