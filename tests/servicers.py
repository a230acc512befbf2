"""Servicers served inside the test process, on 127.0.0.1:0, by the services' own start-up code.

`start_aio_server` (services/serving.py) binds them: the same options, ACL
interceptors, health and reflection as a real process, without starting one. `InProcessBroker`
is one broker (commitlog and indexer on the event loop thread) over a store in a
temporary directory; `in_process_router` the query router over a registry the test fills.
End-to-end tests keep what needs processes (lifecycle, crashes, TLS, compose).
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

import grpc

from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, indexer_pb2, indexer_pb2_grpc, router_pb2, router_pb2_grpc
from quarry.services.commitlog.broker.flush_signal import FlushSignal
from quarry.services.commitlog.doors.quarry_v1 import CommitLogServicer
from quarry.services.commitlog.broker.core import Broker as CommitLogBroker
from quarry.services.commitlog.storage.store import CommitLogStore, StoreConfig
from quarry.services.indexer.checkpoint import IndexCheckpoint
from quarry.services.indexer.index_store import IndexStore, IndexStoreConfig
from quarry.services.indexer.doors.quarry_v1 import IndexerServicer
from quarry.services.query.broker_clients import BrokerClients
from quarry.services.query.queries import Queries, QuerySettings
from quarry.services.query.registry import Broker, BrokerRegistry
from quarry.services.query.doors.quarry_v1 import QueryRouterServicer
from quarry.services.serving import Registration, RunningAioServer, start_aio_server, stop_server

BIND = "127.0.0.1:0"


class EventLoopThread:
    """An event loop on a thread of its own, for asyncio servicers (the commitlog). grpc.aio
    serves from one event loop per process: every in-process asyncio server shares `shared()`."""

    _shared: "EventLoopThread | None" = None
    _shared_lock = threading.Lock()

    @classmethod
    def shared(cls) -> "EventLoopThread":
        with cls._shared_lock:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="aio-servicer", daemon=True)
        self._thread.start()

    def run(self, coro: Awaitable[Any], timeout_s: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)  # type: ignore[arg-type]

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


@contextmanager
def serve_aio(name: str, build: Callable[[asyncio.AbstractEventLoop], list[Registration]], max_message_bytes: int = 128 << 20) -> Iterator[RunningAioServer]:
    """An asyncio servicer served on the shared loop thread; `build` runs on that loop."""
    loop = EventLoopThread.shared()

    async def start() -> RunningAioServer:
        return await start_aio_server(name, BIND, build(loop.loop), max_message_bytes=max_message_bytes)

    running: RunningAioServer = loop.run(start())
    try:
        yield running
    finally:
        loop.run(stop_server(running, 0))


@dataclass
class InProcessBroker:
    """One broker in the test process: a commitlog and an indexer, served on loopback ports.

    `store_host` is what its offsetMsgIds carry (distinct per broker, as on real hosts). The
    indexer is fed by `index_all` (what its tailer would do), so a test needs no waiting.
    """

    name: str
    root: Path
    store_host: tuple[str, int]
    segment_size: int = 1 << 20
    hash_slots: int = 101
    index_num: int = 4000
    commitlog_addr: str = ""
    commitlog_server: RunningAioServer | None = None  # its tracker's metrics count the calls it served
    indexer_addr: str = ""
    store: CommitLogStore | None = None
    index: IndexStore | None = None
    _stack: list[Any] = field(default_factory=list)

    def start(self) -> "InProcessBroker":
        self.store = CommitLogStore(StoreConfig(store_dir=self.root / self.name / "store", store_host=self.store_host, segment_size=self.segment_size))
        stopping = threading.Event()

        def build(loop: asyncio.AbstractEventLoop) -> list[Registration]:
            flushed = FlushSignal(loop)
            assert self.store is not None
            self.store.add_flush_listener(flushed.fire)
            servicer = CommitLogServicer(CommitLogBroker(self.store, self.name, stopping, flushed))
            name = commitlog_pb2.DESCRIPTOR.services_by_name["CommitLogService"].full_name
            return [Registration(lambda s: commitlog_pb2_grpc.add_CommitLogServiceServicer_to_server(servicer, s), name)]

        commitlog = serve_aio(f"{self.name}-commitlog", build, max_message_bytes=64 << 20)
        self.commitlog_server = commitlog.__enter__()
        self.commitlog_addr = self.commitlog_server.address
        self._stack.append((commitlog, stopping))
        self.index = IndexStore.open(self.root / self.name / "index", IndexStoreConfig(hash_slot_num=self.hash_slots, index_num=self.index_num))
        self.lock = threading.Lock()

        def build_indexer(loop: asyncio.AbstractEventLoop) -> list[Registration]:
            # Built on the loop: its channel to the commitlog is an asyncio one.
            assert self.index is not None
            self.indexer_servicer = IndexerServicer(self.name, self.index, self.lock, self.commitlog_addr, None, IndexCheckpoint(self.root / self.name / "ckpt"))
            name = indexer_pb2.DESCRIPTOR.services_by_name["IndexerService"].full_name
            return [Registration(lambda s: indexer_pb2_grpc.add_IndexerServiceServicer_to_server(self.indexer_servicer, s), name)]

        indexer = serve_aio(f"{self.name}-indexer", build_indexer)
        self.indexer_addr = indexer.__enter__().address
        self._stack.append((indexer, None))
        self._indexed_to = 0
        return self

    @property
    def store_host_text(self) -> str:
        return f"{self.store_host[0]}:{self.store_host[1]}"

    def registration(self) -> Broker:
        assert self.store is not None
        return Broker(self.name, self.commitlog_addr, self.indexer_addr, self.store_host_text, topics=dict(self.store.topics))

    def index_all(self) -> None:
        """Index every durable record not indexed yet (as the indexer's Tail would)."""
        assert self.store is not None and self.index is not None
        self.store.flush()
        end = self.store.committed_offset
        while self._indexed_to < end:
            infos, self._indexed_to = self.store.read_dispatch(self._indexed_to, 1024, end)
            with self.lock:
                self.index.index_records(infos)

    def stop_indexer(self) -> None:
        """The indexer stops answering (its server is gone); the commitlog keeps serving."""
        for i, (ctx, extra) in enumerate(self._stack):
            if extra is None:
                ctx.__exit__(None, None, None)
                del self._stack[i]
                EventLoopThread.shared().run(self.indexer_servicer.close())
                return

    def close(self) -> None:
        for ctx, stopping in reversed(self._stack):
            if stopping is not None:
                stopping.set()
            ctx.__exit__(None, None, None)
        self._stack.clear()
        if self.indexer_servicer is not None:
            EventLoopThread.shared().run(self.indexer_servicer.close())
        if self.index is not None:
            self.index.close()
        if self.store is not None:
            self.store.close()


def send(broker: InProcessBroker, channel: grpc.Channel, topic: str, body: bytes, keys: list[str] = (), unique_key: str = "", tags: str = "TagA") -> common_pb2.SendResult:  # type: ignore[assignment]
    msg = common_pb2.MessageInput(topic=topic, body=body, keys=list(keys), unique_key=unique_key, queue_id=-1, tags=tags)
    return commitlog_pb2_grpc.CommitLogServiceStub(channel).SendMessage(commitlog_pb2.SendMessageRequest(message=msg), timeout=5).result


@contextmanager
def in_process_router(registry: BrokerRegistry, settings: QuerySettings | None = None) -> Iterator[tuple[str, Queries]]:
    """The router's servicer over `registry`, on the shared loop as the real router serves it;
    yields (address, the Queries it uses: its coroutines run with `on_loop`)."""
    clients = BrokerClients()
    queries = Queries(registry, clients, settings or QuerySettings(query_timeout_ms=2000, broker_call_timeout_ms=1000))
    servicer = QueryRouterServicer(registry, queries)
    name = router_pb2.DESCRIPTOR.services_by_name["QueryRouterService"].full_name
    try:
        with serve_aio("router", lambda _loop: [Registration(lambda s: router_pb2_grpc.add_QueryRouterServiceServicer_to_server(servicer, s), name)]) as running:
            yield running.address, queries
    finally:
        on_loop(clients.close())


def on_loop(coro: Awaitable[Any], timeout_s: float = 30.0) -> Any:
    """Run a coroutine of an in-process service (a router query) on the shared loop; its result."""
    return EventLoopThread.shared().run(coro, timeout_s)


class Blocking:
    """An asyncio object (the router's Queries) called from the test thread: each coroutine
    method runs on the shared loop and returns its result (or raises its error)."""

    def __init__(self, target: Any) -> None:
        self._target = target

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._target, name)
        return lambda *args, **kwargs: on_loop(method(*args, **kwargs))
