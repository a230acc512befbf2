"""Key presence watched in process: an indexer's publisher (services/indexer/presence.py)
served by its servicer on loopback, and the router's copies (services/query/presence.py).

The copies are advisory: the indexer never waits for a watcher. So these tests check that a
copy gets every batch's keys, that a router trusts a copy only while it is current (updated
lately, not behind a position an answer showed), and that a watcher that stops reading
delays nothing and is dropped.
"""
from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import grpc
import pytest

from quarry.formats.index_keys import key_name
from quarry.formats.java_hash import index_key_hash
from quarry.services import key_presence
from quarry.services.indexer.checkpoint import IndexCheckpoint
from quarry.services.indexer.index_store import IndexStore, IndexStoreConfig
from quarry.services.indexer.presence import KeyPresencePublisher
from quarry.services.indexer.doors.quarry_v1 import IndexerServicer
from quarry.services.query.presence import PresenceCopies, key_hashes
from quarry.services.serving import Registration
from quarry.v1 import common_pb2, indexer_pb2, indexer_pb2_grpc
from tests.e2e.conftest import wait_until
from tests.servicers import on_loop, serve_aio


class Indexer:
    """An index, its publisher (None: read-only) and its servicer on the shared loop."""

    def __init__(self, root: Path, keep_presence: bool = True) -> None:
        self.index = IndexStore.open(root / "index", IndexStoreConfig(hash_slot_num=101, index_num=4000))
        self.lock = threading.Lock()
        self.publisher: KeyPresencePublisher | None = None
        self._keep, self._root = keep_presence, root

    def __enter__(self) -> "Indexer":
        def build(_loop: asyncio.AbstractEventLoop) -> list[Registration]:
            self.publisher = KeyPresencePublisher(self.index, self.lock).start() if self._keep else None
            self.servicer = IndexerServicer("broker-a", self.index, self.lock, "127.0.0.1:1", None, IndexCheckpoint(self._root / "ckpt"), None, self.publisher)
            name = indexer_pb2.DESCRIPTOR.services_by_name["IndexerService"].full_name
            return [Registration(lambda s: indexer_pb2_grpc.add_IndexerServiceServicer_to_server(self.servicer, s), name)]

        self._served = serve_aio("indexer", build)
        self.address = self._served.__enter__().address
        return self

    def __exit__(self, *exc: Any) -> None:
        self._served.__exit__(None, None, None)
        on_loop(self.servicer.close())
        self.index.close()

    def index_keys(self, keys: list[str], offset: int) -> None:
        """Index a record's keys as the tailer does: write, then add, in one step."""
        record = common_pb2.DispatchRecord(physical_offset=offset, topic="T", keys=" ".join(keys), store_timestamp=1_700_000_000_000 + offset)
        publisher = self.publisher
        assert publisher is not None

        async def run() -> None:
            with self.lock:
                batch = self.index.prepare_records([record])
                self.index.write_prepared(batch)
                publisher.add(batch.key_hashes)

        on_loop(run())


def _hash(key: str) -> int:
    return index_key_hash(key_name("T", key))


@pytest.fixture
def indexer(tmp_path: Path) -> Iterator[Indexer]:
    with Indexer(tmp_path) as ix:
        yield ix


@pytest.fixture
def copies() -> Iterator[PresenceCopies]:
    channels: dict[str, grpc.aio.Channel] = {}

    def stub(address: str) -> indexer_pb2_grpc.IndexerServiceStub:
        channels.setdefault(address, grpc.aio.insecure_channel(address))
        return indexer_pb2_grpc.IndexerServiceStub(channels[address])

    c = on_loop(_make(stub))
    yield c
    on_loop(c.close())
    for ch in channels.values():
        on_loop(ch.close())


async def _make(stub: Any) -> PresenceCopies:
    return PresenceCopies(stub)


def _rules_out(copies: PresenceCopies, address: str, *keys: str) -> bool:
    async def probe() -> bool:
        return copies.rules_out(address, [_hash(k) for k in keys])
    return on_loop(probe())


def _ruled_out_soon(copies: PresenceCopies, address: str, key: str) -> None:
    """A positive ruling out needs a trusted copy, which a loaded machine may keep from being
    current for a moment (the broker is then asked, by design): waited for, not assumed."""
    wait_until(lambda: _rules_out(copies, address, key), what=f"{key!r} ruled out")


def _watched(copies: PresenceCopies, address: str) -> None:
    _rules_out(copies, address, "x")  # the first query starts the watch

    async def valid() -> bool:
        return copies.valid(address)
    wait_until(lambda: on_loop(valid()), what="a whole copy")


def test_a_copy_gets_every_batch_and_never_rules_out_a_key_it_holds(indexer: Indexer, copies: PresenceCopies) -> None:
    indexer.index_keys(["before"], 100)
    _watched(copies, indexer.address)
    assert not _rules_out(copies, indexer.address, "before")  # in the snapshot
    _ruled_out_soon(copies, indexer.address, "order-1")
    for i in range(20):
        indexer.index_keys([f"order-{i}"], 200 + i)
        assert indexer.index.query("T", f"order-{i}", 10, 0, 2**62) == [200 + i]
        # Until its copy has the batch the router asks the broker; once caught up it has the key.
        wait_until(lambda: on_loop(_position(copies, indexer.address)) >= 200 + i, what=f"the copy at batch {i}")
        assert not _rules_out(copies, indexer.address, f"order-{i}")


def test_a_key_of_a_delayed_message_is_looked_for_under_the_parking_topics() -> None:
    hashes = key_hashes("T", "k")
    assert index_key_hash(key_name("T", "k")) in hashes and len(hashes) > 1


def test_the_filter_is_built_from_the_index_files_on_disk(tmp_path: Path, copies: PresenceCopies) -> None:
    index = IndexStore.open(tmp_path / "index", IndexStoreConfig(hash_slot_num=101, index_num=4000))
    index.index_records([common_pb2.DispatchRecord(physical_offset=10 * i, topic="T", keys=f"old-{i}", store_timestamp=1_700_000_000_000) for i in range(500)])
    index.close()
    with Indexer(tmp_path) as ix:  # several files: index_num 4000 holds them all, one file
        _watched(copies, ix.address)
        assert not any(_rules_out(copies, ix.address, f"old-{i}") for i in range(500))
        _ruled_out_soon(copies, ix.address, "never-sent")


def _raw_watch(address: str) -> tuple[Any, Any]:
    """A watcher of our own: its call and a task reading every update it gets."""
    async def open_() -> tuple[Any, Any]:
        ch = grpc.aio.insecure_channel(address)
        call = indexer_pb2_grpc.IndexerServiceStub(ch).WatchKeyPresence(indexer_pb2.WatchKeyPresenceRequest())
        got: list[Any] = []

        async def read() -> None:
            try:
                async for u in call:
                    got.append(u)
            finally:
                await ch.close()
        return call, (asyncio.ensure_future(read()), got)
    return on_loop(open_())


async def _await(task: Any) -> Any:
    return await task


def test_a_read_only_indexer_is_never_ruled_out(tmp_path: Path, copies: PresenceCopies) -> None:
    with Indexer(tmp_path, keep_presence=False) as ix:
        call, (reader, _got) = _raw_watch(ix.address)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            on_loop(_await(reader))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "read-only" in (err.value.details() or "")
        assert not _rules_out(copies, ix.address, "anything")
        wait_until(lambda: on_loop(_refused(copies, ix.address)), what="the refusal seen")
        assert not _rules_out(copies, ix.address, "anything")


def _small_filters(monkeypatch: pytest.MonkeyPatch, none_larger: bool = False) -> None:
    """Filters of 1,024 bits (room for 102 keys) from the first key on; `none_larger`: that
    is also the largest size."""
    monkeypatch.setattr(key_presence, "MIN_LOG2_BITS", 10)
    if none_larger:
        monkeypatch.setattr(key_presence, "MAX_LOG2_BITS", 10)
        monkeypatch.setattr("quarry.services.indexer.presence.MAX_LOG2_BITS", 10, raising=False)
    monkeypatch.setattr("quarry.services.indexer.presence.MIN_KEYS", 1)


async def _refused(copies: PresenceCopies, address: str) -> str:
    return copies._copies[address].refused


def test_a_full_filter_is_rebuilt_larger_and_watched_again(tmp_path: Path, copies: PresenceCopies, monkeypatch: pytest.MonkeyPatch) -> None:
    _small_filters(monkeypatch)
    with Indexer(tmp_path) as ix:
        assert ix.publisher is not None
        _watched(copies, ix.address)
        first = ix.publisher.filter
        for i in range(0, 150, 10):
            ix.index_keys([f"k{j}" for j in range(i, i + 10)], 100 + i)
        wait_until(lambda: ix.publisher.filter is not first and ix.publisher._building is None, what="the larger filter")  # type: ignore[union-attr]
        assert ix.publisher.filter.log2_bits > first.log2_bits  # type: ignore[union-attr]
        _watched(copies, ix.address)
        assert not any(_rules_out(copies, ix.address, f"k{j}") for j in range(150))
        assert on_loop(_copy_bits(copies, ix.address)) == ix.publisher.filter.log2_bits  # type: ignore[union-attr]


async def _copy_bits(copies: PresenceCopies, address: str) -> int:
    f = copies._copies[address].filter
    return f.log2_bits if f is not None else 0


def test_a_watch_waiting_for_the_first_build_ends_when_the_indexer_stops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A large index takes long to build: the watch waits for it, and a stop must end it too.
    monkeypatch.setattr(KeyPresencePublisher, "_build", lambda self, target, files: None)
    with Indexer(tmp_path) as ix:
        publisher = ix.publisher
        assert publisher is not None and publisher.filter is None
        call, (reader, _got) = _raw_watch(ix.address)

        async def stop() -> None:
            publisher.close()
        on_loop(stop())
        with pytest.raises(grpc.aio.AioRpcError) as err:
            on_loop(_await(reader), timeout_s=10)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "stopping" in (err.value.details() or "")


class _ScriptedCall:
    """An indexer's watch that sends what the test says (a broken or hostile indexer)."""

    def __init__(self, updates: list[indexer_pb2.WatchKeyPresenceResponse]) -> None:
        self._updates = updates
        self._stream = self.stream()
        self.cancelled = False

    def cancel(self) -> bool:
        self.cancelled = True
        return True

    async def read(self) -> Any:
        """As grpc.aio's call reads: the next update, EOF at the end."""
        try:
            return await self._stream.__anext__()
        except StopAsyncIteration:
            return grpc.aio.EOF

    async def stream(self) -> AsyncIterator[indexer_pb2.WatchKeyPresenceResponse]:
        for u in self._updates:
            yield u
        await asyncio.Event().wait()  # then silent, the stream open


@pytest.mark.parametrize("bad", [
    indexer_pb2.WatchKeyPresenceResponse(seq=1, log2_bits=10, hash_count=6, chunk_offset=1 << 20, chunk=b"\xff", snapshot_done=True, heartbeat_ms=1000),
    indexer_pb2.WatchKeyPresenceResponse(seq=1, key_hashes=[1, 2], heartbeat_ms=1000),
    indexer_pb2.WatchKeyPresenceResponse(seq=1, log2_bits=60, hash_count=6, chunk=b"\xff", snapshot_done=True, heartbeat_ms=1000),
])
def test_a_bad_update_drops_the_copy_with_a_warning_naming_the_field(bad: indexer_pb2.WatchKeyPresenceResponse, caplog: pytest.LogCaptureFixture) -> None:
    def stub(_address: str) -> Any:
        class Stub:
            def WatchKeyPresence(self, request: Any) -> _ScriptedCall:
                return _ScriptedCall([bad])
        return Stub()

    copies = on_loop(_make(stub))
    try:
        _rules_out(copies, "127.0.0.1:9", "x")
        wait_until(lambda: any(r.levelname == "WARNING" and "bad key presence update" in r.getMessage() for r in caplog.records), what="the warning")
        assert not on_loop(_valid(copies, "127.0.0.1:9"))
        text = " ".join(str(getattr(r, "kv", "")) for r in caplog.records)
        assert any(field in text for field in ("chunk_offset", "log2_bits", "whole snapshot"))
    finally:
        on_loop(copies.close())


async def _valid(copies: PresenceCopies, address: str) -> bool:
    return copies.valid(address)


def test_a_full_filter_at_the_largest_size_is_not_rebuilt_again_and_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Beyond the largest filter's capacity it only answers "may hold" more often: a rebuild
    # could be no larger, and each would re-read every file and drop every watcher.
    _small_filters(monkeypatch, none_larger=True)
    with Indexer(tmp_path) as ix:
        publisher = ix.publisher
        assert publisher is not None
        wait_until(lambda: publisher.filter is not None, what="the first filter")
        builds: list[int] = []
        begin = publisher._begin_build
        monkeypatch.setattr(publisher, "_begin_build", lambda keys: (builds.append(keys), begin(keys)))
        for i in range(0, 300, 10):
            ix.index_keys([f"k{j}" for j in range(i, i + 10)], 100 + i)
        assert builds == []


class _Pauses:
    """asyncio for services/query/presence.py, with the pauses before watching again recorded
    (and not waited)."""

    def __init__(self) -> None:
        self.pauses: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    async def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        await asyncio.sleep(0)


@pytest.mark.parametrize("open_s,grows", [(0.08, False), (0.0, True)])
def test_the_pause_before_watching_again_starts_over_after_a_lasting_watch_only(open_s: float, grows: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # Resizes and restarts end watches that worked for long: over a router's life they must not
    # add up to the longest pause (the broker asked every key query meanwhile). A watch that
    # ends as soon as it starts (a router too slow for the indexer) still backs off: each
    # snapshot costs the indexer a copy of its filter.
    monkeypatch.setattr("quarry.services.query.presence.RETRY_S", (0.01, 0.05))
    pauses = _Pauses()
    monkeypatch.setattr("quarry.services.query.presence.asyncio", pauses)

    class _EndsAfterSnapshot(_ScriptedCall):
        async def stream(self) -> AsyncIterator[indexer_pb2.WatchKeyPresenceResponse]:
            for u in self._updates:
                yield u
            await asyncio.sleep(open_s)  # then the indexer ends the watch (as a resize does)

    def stub(_address: str) -> Any:
        class Stub:
            def WatchKeyPresence(self, request: Any) -> _ScriptedCall:
                return _EndsAfterSnapshot([indexer_pb2.WatchKeyPresenceResponse(seq=1, log2_bits=10, hash_count=6, chunk=bytes(128), snapshot_done=True, heartbeat_ms=1000)])
        return Stub()

    copies = on_loop(_make(stub))
    try:
        _rules_out(copies, "127.0.0.1:9", "x")
        wait_until(lambda: len(pauses.pauses) >= 6, what="watched again six times")
        assert (pauses.pauses[5] == 0.05) == grows, pauses.pauses
    finally:
        on_loop(copies.close())


def test_a_failed_first_build_is_tried_again_after_a_pause(tmp_path: Path, copies: PresenceCopies, monkeypatch: pytest.MonkeyPatch) -> None:
    from quarry.formats.index_file import IndexFile

    index = IndexStore.open(tmp_path / "index", IndexStoreConfig(hash_slot_num=101, index_num=4000))
    index.index_records([common_pb2.DispatchRecord(physical_offset=10, topic="T", keys="old", store_timestamp=1_700_000_000_000)])
    index.close()
    real, failures = IndexFile.key_hash_chunks, []

    def flaky(self: IndexFile, *args: Any, **kw: Any) -> Any:
        if not failures:
            failures.append(1)
            raise OSError("transient read error")
        return real(self, *args, **kw)

    monkeypatch.setattr(IndexFile, "key_hash_chunks", flaky)
    monkeypatch.setattr("quarry.services.indexer.presence.BUILD_RETRY_S", 0.2)
    with Indexer(tmp_path) as ix:
        assert ix.publisher is not None
        wait_until(lambda: ix.publisher.failed or ix.publisher.filter, what="the first build's end")  # type: ignore[union-attr]
        assert failures and "transient read error" in ix.publisher.failed
        _call, (reader, _got) = _raw_watch(ix.address)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            on_loop(_await(reader))
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "not built" in (err.value.details() or "")
        wait_until(lambda: ix.publisher.filter is not None, what="the build tried again")  # type: ignore[union-attr]
        assert not ix.publisher.failed
        _watched(copies, ix.address)
        assert not _rules_out(copies, ix.address, "old")
        _ruled_out_soon(copies, ix.address, "new")


def test_a_failing_rebuild_is_not_begun_again_at_every_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from quarry.formats.index_file import IndexFile

    _small_filters(monkeypatch)
    with Indexer(tmp_path) as ix:
        publisher = ix.publisher
        assert publisher is not None
        wait_until(lambda: publisher.filter is not None, what="the first build")
        builds: list[int] = []

        def failing(self: IndexFile, *args: Any, **kw: Any) -> Any:
            builds.append(1)
            raise OSError("disk gone")

        monkeypatch.setattr(IndexFile, "key_hash_chunks", failing)
        for i in range(0, 150, 10):  # fills the filter: a rebuild is wanted at every batch
            ix.index_keys([f"k{j}" for j in range(i, i + 10)], 100 + i)
            wait_until(lambda: publisher._building is None, what="the rebuild's end")
        assert len(builds) == 1  # one attempt, then a pause of BUILD_RETRY_S
        assert publisher.filter is not None and not publisher.failed  # the full filter stays in use


def test_a_watch_refused_by_acl_is_not_retried_at_once() -> None:
    # With ACL on the router signs its unary calls only; an indexer refusing the unsigned watch
    # is asked every key query and watched again after REFUSED_RETRY_S, not every 0.2 s.
    calls: list[int] = []

    class Refused:
        def __init__(self) -> None:
            calls.append(1)

        async def read(self) -> Any:
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAUTHENTICATED, grpc.aio.Metadata(), grpc.aio.Metadata(), "unsigned call")

        def cancel(self) -> None:
            pass

    class Stub:
        def WatchKeyPresence(self, request: Any) -> Refused:
            return Refused()

    copies = on_loop(_make(lambda _address: Stub()))
    try:
        assert not _rules_out(copies, "10.0.0.9:1", "k")
        wait_until(lambda: on_loop(_refused(copies, "10.0.0.9:1")), what="the refusal seen")
        assert "UNAUTHENTICATED" in on_loop(_refused(copies, "10.0.0.9:1")) and len(calls) == 1
        assert not _rules_out(copies, "10.0.0.9:1", "k")
    finally:
        on_loop(copies.close())


def test_a_sender_that_fell_behind_its_heartbeat_still_sends_what_is_queued(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A slow link or a busy loop: the heartbeat is overdue when the sender comes back for the
    # next update. It must send what is queued (the batch, then the drop's end) first.
    from quarry.services.errors import Unavailable

    index = IndexStore.open(tmp_path / "index", IndexStoreConfig(hash_slot_num=101, index_num=4000))
    lock = threading.Lock()
    monkeypatch.setattr("quarry.services.indexer.presence.HEARTBEAT_S", 0.0)

    async def scenario() -> tuple[list[int], str]:
        publisher = KeyPresencePublisher(index, lock).start()
        watch = publisher.watch()
        while not (await asyncio.wait_for(watch.__anext__(), 10)).snapshot_done:
            pass
        with lock:
            publisher.add([_hash("k")])
        batch = await asyncio.wait_for(watch.__anext__(), 10)
        publisher.close()  # ends the watch: queued as the stream's end
        with pytest.raises(Unavailable) as ended:
            while True:
                await asyncio.wait_for(watch.__anext__(), 10)
        return list(batch.key_hashes), str(ended.value)

    try:
        hashes, why = on_loop(scenario())
    finally:
        index.close()
    assert hashes == [_hash("k")]
    assert "stopping" in why


def test_a_watch_that_falls_silent_without_ending_is_watched_again(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # A half-open connection (the indexer's host gone without a word) never ends the stream:
    # without a limit the copy would stay untrusted, and the broker asked every query, for good.
    monkeypatch.setattr("quarry.services.query.presence.RETRY_S", (0.01, 0.05))
    monkeypatch.setattr("quarry.services.query.presence.SILENT_S", 0.05)
    snapshot = indexer_pb2.WatchKeyPresenceResponse(seq=1, log2_bits=10, hash_count=6, chunk=bytes(128), snapshot_done=True, heartbeat_ms=20)
    calls: list[_ScriptedCall] = []

    def stub(_address: str) -> Any:
        class Stub:
            def WatchKeyPresence(self, request: Any) -> _ScriptedCall:
                calls.append(_ScriptedCall([snapshot]))  # then silent, the stream open
                return calls[-1]
        return Stub()

    copies = on_loop(_make(stub))
    try:
        _rules_out(copies, "127.0.0.1:9", "x")
        wait_until(lambda: len(calls) >= 2, what="watched again")
        assert calls[0].cancelled
        silent = [r.kv for r in caplog.records if "key presence watch silent" in r.getMessage()]  # type: ignore[attr-defined]
        assert silent and silent[0]["indexer"] == "127.0.0.1:9" and "within 0.05 s" in silent[0]["reason"], silent
    finally:
        on_loop(copies.close())


class _FreezingProxy:
    """A TCP proxy on the shared loop whose connections can be frozen: their bytes stop in both
    directions and nothing closes, as on a connection whose peer vanished without a word
    (a half-open connection). Connections made after `freeze` pass bytes as usual."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.connections = 0
        self._frozen_before = -1  # connections numbered below this are frozen
        self._thaw: asyncio.Event | None = None

    async def start(self) -> str:
        self._thaw = asyncio.Event()
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    def freeze(self) -> None:
        self._frozen_before = self.connections

    async def close(self) -> None:
        assert self._thaw is not None
        self._thaw.set()
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number = self.connections
        self.connections += 1
        host, port = self.upstream.rsplit(":", 1)
        up_reader, up_writer = await asyncio.open_connection(host, int(port))

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    if number < self._frozen_before:
                        assert self._thaw is not None
                        await self._thaw.wait()  # frozen: nothing passes, nothing closes
                        return
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))


def test_a_watch_over_a_connection_gone_silent_is_found_by_keepalive_and_watched_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The router's channel to an indexer is cached: without keepalive a half-open connection
    # would look alive, and every watch (and key query) sent over it would hang until TCP gives
    # up, some 15 minutes. Keepalive pings find it within time + timeout; the next watch
    # goes over a new connection.
    from quarry.channels import open_aio_channel

    monkeypatch.setattr("quarry.channels.KEEPALIVE_TIME_MS", 300)
    monkeypatch.setattr("quarry.channels.KEEPALIVE_TIMEOUT_MS", 300)
    monkeypatch.setattr("quarry.services.serving.MIN_PING_INTERVAL_MS", 100)
    monkeypatch.setattr("quarry.services.query.presence.RETRY_S", (0.01, 0.05))
    with Indexer(tmp_path) as ix:
        proxy = _FreezingProxy(ix.address)
        address = on_loop(proxy.start())
        channels: list[Any] = []

        def stub(_address: str) -> Any:
            if not channels:
                channels.append(open_aio_channel(address))  # (called on the loop)
            return indexer_pb2_grpc.IndexerServiceStub(channels[0])

        copies = on_loop(_make(stub))
        try:
            _watched(copies, address)
            proxy.freeze()
            wait_until(lambda: proxy.connections >= 2 and on_loop(_valid(copies, address)), what="watched again over a new connection")
        finally:
            on_loop(copies.close())
            for ch in channels:
                on_loop(ch.close())
            on_loop(proxy.close())


async def _position(copies: PresenceCopies, address: str) -> int:
    copy = copies._copies.get(address)
    return copy.position if copy is not None and copy.filter is not None else -2


def test_a_copy_behind_a_position_an_answer_showed_is_not_trusted(indexer: Indexer, copies: PresenceCopies) -> None:
    # Once a query found a message through the broker, a copy older than that answer must not
    # make a later query skip the broker: it is asked until the copy catches up.
    _watched(copies, indexer.address)
    _ruled_out_soon(copies, indexer.address, "absent")
    at = on_loop(_position(copies, indexer.address))

    async def seen(position: int) -> None:
        copies.seen(indexer.address, position, indexer.index.epoch)
    on_loop(seen(at + 1000))
    assert not _rules_out(copies, indexer.address, "absent")
    indexer.index_keys(["later"], at + 1000)
    _ruled_out_soon(copies, indexer.address, "absent")  # caught up by the batch's update
    assert not _rules_out(copies, indexer.address, "later")


def _cut_index_and_answer(indexer: Indexer, copies: PresenceCopies, key: str, offset: int) -> bool:
    """In one loop step (the router reads no update meanwhile): the index cut back as the
    tailer's reconcile does after a log repair, `key` indexed at `offset` as the tailer does,
    a query of it answered as QueryMessage does (position and epoch) and seen as queries.py
    sees it; then whether the next query would skip the broker."""
    publisher = indexer.publisher
    assert publisher is not None

    async def run() -> bool:
        with indexer.lock:
            indexer.index.drop_after(100, 1_700_000_000_100)
            record = common_pb2.DispatchRecord(physical_offset=offset, topic="T", keys=key, store_timestamp=1_700_000_000_000 + offset)
            batch = indexer.index.prepare_records([record])
            indexer.index.write_prepared(batch)
            publisher.add(batch.key_hashes)
            assert indexer.index.query("T", key, 10, 0, 2**62) == [offset]
            position, epoch = indexer.index.last_update_phy_offset, indexer.index.epoch
        copies.seen(indexer.address, position, epoch)
        return copies.rules_out(indexer.address, [_hash(key)])
    return on_loop(run())


def test_a_copy_from_before_the_index_was_cut_back_is_not_trusted_after_an_answer_from_after(indexer: Indexer, copies: PresenceCopies) -> None:
    # Positions are log offsets: a cut (the log repaired below what was indexed) moves the
    # index's back, so a copy at 2,000 from before the cut is not "at or past" an answer at 600
    # from after it, though it lacks the key that answer found. The epoch tells them apart.
    indexer.index_keys(["a"], 100)
    indexer.index_keys(["b"], 2000)
    _watched(copies, indexer.address)
    _ruled_out_soon(copies, indexer.address, "absent")
    assert on_loop(_position(copies, indexer.address)) == 2000
    assert not _cut_index_and_answer(indexer, copies, "after-cut", 600)
    # The copy goes on in the new epoch (its filter holds every key it had, and the new ones).
    _ruled_out_soon(copies, indexer.address, "absent")
    assert on_loop(_position(copies, indexer.address)) == 600
    assert not _rules_out(copies, indexer.address, "after-cut")
    assert not _rules_out(copies, indexer.address, "a")

    async def answer() -> indexer_pb2.QueryMessageResponse:  # what queries.py hands to seen()
        async with grpc.aio.insecure_channel(indexer.address) as ch:
            request = indexer_pb2.QueryMessageRequest(topic="T", key="after-cut", end_timestamp=2**62, offsets_only=True)
            return await indexer_pb2_grpc.IndexerServiceStub(ch).QueryMessage(request, timeout=10)
    got = on_loop(answer())
    assert list(got.physical_offsets) == [600] and got.index_last_update_phy_offset == 600
    assert got.index_epoch == indexer.index.epoch != 0


def test_a_copy_whose_updates_stop_coming_is_not_trusted(indexer: Indexer, copies: PresenceCopies, monkeypatch: pytest.MonkeyPatch) -> None:
    # Heartbeats stop (a stalled stream the router has not yet seen end): the copy may lack
    # what the indexer wrote since, so the broker is asked.
    _watched(copies, indexer.address)
    _ruled_out_soon(copies, indexer.address, "absent")

    async def stale() -> None:
        copies._copies[indexer.address].fresh_until = time.monotonic() - 0.001
    monkeypatch.setattr("quarry.services.indexer.presence.HEARTBEAT_S", 3600.0)  # no heartbeat refreshes it
    on_loop(stale())
    assert not _rules_out(copies, indexer.address, "absent")


def test_a_watcher_that_stops_reading_delays_no_batch_and_is_dropped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A stopped or slow router: its updates queue up while the indexer writes on, each batch
    # written at once; past MAX_QUEUED the watcher is dropped, its stream ended.
    from quarry.services.errors import Unavailable

    monkeypatch.setattr("quarry.services.indexer.presence.MAX_QUEUED", 5)
    index = IndexStore.open(tmp_path / "index", IndexStoreConfig(hash_slot_num=101, index_num=4000))
    lock = threading.Lock()

    async def scenario() -> tuple[list[int], int, str]:
        publisher = KeyPresencePublisher(index, lock).start()
        watch = publisher.watch()
        while not (await asyncio.wait_for(watch.__anext__(), 10)).snapshot_done:
            pass
        assert publisher.watchers == 1
        written = []
        for i in range(10):  # the watcher reads nothing meanwhile
            record = common_pb2.DispatchRecord(physical_offset=100 + i, topic="T", keys=f"k{i}", store_timestamp=1_700_000_000_000 + i)
            with lock:
                batch = index.prepare_records([record])
                index.write_prepared(batch)
                publisher.add(batch.key_hashes)  # returns at once: nothing to wait for
            written.append(index.last_update_phy_offset)
        watchers = publisher.watchers
        with pytest.raises(Unavailable) as ended:
            while True:
                await asyncio.wait_for(watch.__anext__(), 10)
        return written, watchers, str(ended.value)

    try:
        written, watchers, why = on_loop(scenario())
    finally:
        index.close()
    assert written == list(range(100, 110))
    assert watchers == 0 and "updates not read" in why


def test_a_snapshot_larger_than_the_queue_limit_does_not_drop_its_watcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # At the largest filter a snapshot is 512 chunks: were they counted toward MAX_QUEUED, a
    # router slow to read them would be dropped before it had the filter, again at every watch.
    monkeypatch.setattr("quarry.services.indexer.presence.MAX_QUEUED", 5)
    monkeypatch.setattr("quarry.services.indexer.presence.CHUNK_BYTES", 64 << 10)  # the smallest filter: 32 chunks
    index = IndexStore.open(tmp_path / "index", IndexStoreConfig(hash_slot_num=101, index_num=4000))
    lock = threading.Lock()

    async def scenario() -> tuple[int, int, list[list[int]]]:
        publisher = KeyPresencePublisher(index, lock).start()
        await asyncio.wait_for(publisher._ready.wait(), 10)  # type: ignore[union-attr]
        watch = publisher.watch()
        updates = [await asyncio.wait_for(watch.__anext__(), 10)]  # the first chunk: watching
        for i in range(3):  # fewer than MAX_QUEUED batches while 31 chunks are still to send
            with lock:
                publisher.add([_hash(f"k{i}")])
        watchers = publisher.watchers
        while not updates[-1].snapshot_done:
            updates.append(await asyncio.wait_for(watch.__anext__(), 10))
        batches = [list((await asyncio.wait_for(watch.__anext__(), 10)).key_hashes) for _ in range(3)]
        publisher.close()
        return len(updates), watchers, batches

    try:
        chunks, watchers, batches = on_loop(scenario())
    finally:
        index.close()
    assert chunks == 32 and watchers == 1
    assert batches == [[_hash(f"k{i}")] for i in range(3)]


@pytest.mark.parametrize("queued", [0, 3])
def test_a_copy_whose_update_left_with_more_queued_behind_it_is_not_trusted(queued: int) -> None:
    # An update is fresh when it arrives, not as old as it is: a router reading through a
    # backlog gets each update "just now" while the index is well ahead. The indexer says how
    # many were queued behind each update it sent; until one left with none, the copy is behind.
    snapshot = indexer_pb2.WatchKeyPresenceResponse(seq=1, log2_bits=10, hash_count=6, chunk=bytes(128), snapshot_done=True,
                                                    position=100, epoch=7, heartbeat_ms=60_000, queued=1)
    batch = indexer_pb2.WatchKeyPresenceResponse(seq=2, key_hashes=[_hash("k")], position=500, epoch=7, heartbeat_ms=60_000, queued=queued)

    def stub(_address: str) -> Any:
        class Stub:
            def WatchKeyPresence(self, request: Any) -> _ScriptedCall:
                return _ScriptedCall([snapshot, batch])
        return Stub()

    copies = on_loop(_make(stub))
    try:
        _rules_out(copies, "127.0.0.1:9", "x")  # starts the watch
        wait_until(lambda: on_loop(_position(copies, "127.0.0.1:9")) == 500, what="the batch in the copy")
        assert not _rules_out(copies, "127.0.0.1:9", "k")
        assert _rules_out(copies, "127.0.0.1:9", "absent") == (queued == 0)
    finally:
        on_loop(copies.close())


def test_each_update_says_how_many_are_queued_behind_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("quarry.services.indexer.presence.CHUNK_BYTES", 1 << 20)
    index = IndexStore.open(tmp_path / "index", IndexStoreConfig(hash_slot_num=101, index_num=4000))
    lock = threading.Lock()

    async def scenario() -> list[tuple[bool, int]]:
        publisher = KeyPresencePublisher(index, lock).start()
        await asyncio.wait_for(publisher._ready.wait(), 10)  # type: ignore[union-attr]
        watch = publisher.watch()
        got = [await asyncio.wait_for(watch.__anext__(), 10)]
        with lock:
            for i in range(3):
                publisher.add([_hash(f"k{i}")])
        while len(got) < 3 + len(publisher.filter.chunks(1 << 20)):  # type: ignore[union-attr]
            got.append(await asyncio.wait_for(watch.__anext__(), 10))
        publisher.close()
        return [(u.snapshot_done, u.queued) for u in got]

    try:
        got = on_loop(scenario())
    finally:
        index.close()
    chunks = len(got) - 3
    # Each chunk but the first left with the rest of the snapshot and the 3 batches behind it.
    assert got[1:] == [(i == chunks - 1, chunks - 1 - i + 3) for i in range(1, chunks)] + [(False, 2), (False, 1), (False, 0)]
