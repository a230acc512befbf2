"""The indexer's tailer survives a failure to index (a full disk, a damaged IndexFile): it is
reported, health says why, and the records are indexed once the failure clears, none lost."""
from __future__ import annotations

import errno
from pathlib import Path
from typing import Any, Sequence

import grpc
import pytest

from quarry.services.indexer.main import tail_health
from quarry.services.indexer.tailer import Tailer
from quarry.v1 import common_pb2
from tests.e2e.conftest import wait_until
from tests.servicers import InProcessBroker, on_loop, send


class _Sink:
    """An index that refuses writes while `full` is set, as a full disk would."""

    def __init__(self) -> None:
        self.full = False
        self.offsets: list[int] = []

    def index_records(self, records: Sequence[common_pb2.DispatchRecord]) -> None:
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.offsets += [r.physical_offset for r in records]

    def prepare_flush(self) -> list[Any]:
        return []


class _Checkpoint:
    def save(self, offset: int, timestamp: int) -> None:
        pass


@pytest.fixture
def broker(tmp_path: Path) -> Any:
    b = InProcessBroker("broker-t", tmp_path, ("127.0.0.71", 10911)).start()
    yield b
    b.close()


def test_an_indexing_failure_is_reported_and_survived(broker: InProcessBroker, caplog: pytest.LogCaptureFixture) -> None:
    sink = _Sink()

    async def start() -> Tailer:
        return Tailer(broker.commitlog_addr, sink, _Checkpoint(), 0, flush_interval_ms=10).start()

    tailer: Tailer = on_loop(start())
    try:
        with grpc.insecure_channel(broker.commitlog_addr) as ch:
            first = send(broker, ch, "TailT", b"one")
            wait_until(lambda: sink.offsets == [first.physical_offset], what="first record indexed")
            assert tail_health(tailer) == ""
            sink.full = True
            sent = [send(broker, ch, "TailT", f"m{i}".encode()) for i in range(3)]
            wait_until(lambda: "indexing failed" in tail_health(tailer), what="health names the indexing failure")
            assert "ENOSPC" in tailer.state.last_error or "No space" in tailer.state.last_error
            sink.full = False
            wait_until(lambda: tail_health(tailer) == "", what="healthy again once indexing works")
            expected = [first.physical_offset] + [s.physical_offset for s in sent]
            wait_until(lambda: sink.offsets == expected, what="every record indexed once")
        failures = [r for r in caplog.records if "indexing failed" in str(getattr(r, "kv", {}).get("error", ""))]
        assert len(failures) == 1, "the failure is reported once, not on every retry"
    finally:
        on_loop(tailer.aclose())


def test_a_tail_silent_without_ending_is_opened_again(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # A commitlog whose host vanished without a word (a half-open connection) never ends the
    # stream; it also stops the empty response it sends each second. The tail reconnects.
    import asyncio

    from quarry.services.serving import Registration
    from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc
    from tests.servicers import serve_aio

    monkeypatch.setattr("quarry.services.indexer.tailer.TAIL_SILENT_S", 0.2)
    opened: list[int] = []

    class Silent(commitlog_pb2_grpc.CommitLogServiceServicer):
        async def Tail(self, request: Any, context: Any) -> Any:
            opened.append(request.from_offset)
            yield commitlog_pb2.TailResponse(next_offset=request.from_offset, max_offset=request.from_offset)
            await asyncio.Event().wait()  # then nothing, the stream open

    def build(_loop: Any) -> list[Registration]:
        name = commitlog_pb2.DESCRIPTOR.services_by_name["CommitLogService"].full_name
        return [Registration(lambda s: commitlog_pb2_grpc.add_CommitLogServiceServicer_to_server(Silent(), s), name)]

    with serve_aio("commitlog", build) as served:
        async def start() -> Tailer:
            return Tailer(served.address, _Sink(), _Checkpoint(), 0, flush_interval_ms=10).start()

        tailer: Tailer = on_loop(start())
        try:
            wait_until(lambda: len(opened) >= 2, what="the silent tail opened again")
            said = [str(getattr(r, "kv", {}).get("error", "")) for r in caplog.records if "tail disconnected" in r.getMessage()]
            assert said and "no Tail response within 0.2 s" in said[0], said
        finally:
            on_loop(tailer.aclose())
