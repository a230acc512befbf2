"""Pipeline progress and failures without Spark: running counts sent while a split is read,
percent and ETA, the written part of a preallocated segment, one-line failure reasons."""
from __future__ import annotations

import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("pyspark")

from quarry.pipeline.cli import failure_reason  # noqa: E402
from quarry.pipeline.corrupt import CorruptPolicy  # noqa: E402
from quarry.pipeline.planning import per_segment_plan  # noqa: E402
from quarry.pipeline.progress import LiveCounts, StageCounters, progress_line  # noqa: E402
from quarry.pipeline.reader import SplitWalker  # noqa: E402
from quarry.pipeline.stores import open_stores  # noqa: E402
from quarry.services.commitlog.storage.message_input import NewMessage  # noqa: E402
from quarry.services.commitlog.storage.store import CommitLogStore, StoreConfig  # noqa: E402


class Counter:
    def __init__(self) -> None:
        self.value = 0

    def add(self, n: int) -> None:
        self.value += n


def _preallocated_store(root: Path, n: int) -> int:
    """n records in one 16 MiB segment (zero fill after them); returns the bytes written."""
    store = CommitLogStore(StoreConfig(store_dir=root, segment_size=16 << 20))
    store.append_many([NewMessage(topic="ProgressTopic", body=b"x" * 40, keys=[f"k{i}"]) for i in range(n)])
    written = store.write_offset
    store.close()
    assert (root / "commitlog" / "00000000000000000000").stat().st_size == 16 << 20
    return written


def test_a_split_reports_running_counts_while_it_is_read_and_only_its_written_bytes(tmp_path: Path) -> None:
    written = _preallocated_store(tmp_path / "s", 1000)
    stores = open_stores([f"s={tmp_path / 's'}"])
    assert stores[0].total_bytes == written  # not the 16 MiB file
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    sink.settimeout(5)
    counters = StageCounters(Counter(), Counter(), Counter(), ("127.0.0.1", sink.getsockname()[1], "tok"))
    walker = SplitWalker(per_segment_plan(stores)[0], CorruptPolicy(skip=False), counters=counters)
    assert sum(1 for _ in walker) == 1000
    assert walker.result.bytes == written and walker.result.end_kind == "end-of-data"
    first = sink.recv(256).decode().split()
    # The first tick leaves at record 256, long before the split ends; the last is the total.
    assert first[:3] == ["tok", "0", "256"] and 0 < int(first[3]) < written
    ticks = [first]
    while int(ticks[-1][2]) < 1000:
        ticks.append(sink.recv(256).decode().split())
    assert ticks[-1] == ["tok", "0", "1000", str(written)]
    sink.close()


def test_live_counts_sum_the_latest_count_of_each_split_of_a_stage() -> None:
    live = LiveCounts("127.0.0.1")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for msg in (b"a 0 10 100", b"a 1 5 50", b"a 0 20 200", b"a 0 15 150", b"b 0 99 999", b"junk"):
                s.sendto(msg, live.address)
        from tests.e2e.conftest import wait_until

        wait_until(lambda: live.totals("a") == (25, 250) and live.totals("b") == (99, 999), timeout_s=5, what="datagrams received")
    finally:
        live.close()


def test_progress_line_shows_percent_and_time_left() -> None:
    line = progress_line("export", "decode+write", 0, 4, 5000, 25 << 20, 100 << 20, 10.0)
    assert "25.0 MiB of 100.0 MiB (25.0%)" in line and line.endswith("ETA 30s")
    assert "ETA" not in progress_line("export", "decode+write", 4, 4, 9, 100, 100, 3.0)


def test_failure_reason_is_one_line_from_python_spark_or_java_errors() -> None:
    assert failure_reason(ValueError("bad\nsecond line")) == "ValueError: bad"
    captured = type("AnalysisException", (Exception,), {})("ignored")
    captured.desc = "[UNABLE_TO_INFER_SCHEMA] Unable to infer schema for Parquet.\n\tat org.apache.spark.X"  # type: ignore[attr-defined]
    assert failure_reason(captured) == "AnalysisException: [UNABLE_TO_INFER_SCHEMA] Unable to infer schema for Parquet."
    worker = ("Job aborted due to stage failure: Task 0 failed: org.apache.spark.api.python.PythonException: "
              "Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n    raise OSError(2, 'gone')\n"
              "FileNotFoundError: [Errno 2] No such file: '/data/seg'\n\n\tat org.apache.spark.api.python.X(X.scala:1)")
    java = SimpleNamespace(getClass=lambda: SimpleNamespace(getName=lambda: "org.apache.spark.SparkException"), getMessage=lambda: worker)
    py4j = type("Py4JJavaError", (Exception,), {})("An error occurred")
    py4j.java_exception = java  # type: ignore[attr-defined]
    assert failure_reason(py4j) == "FileNotFoundError: [Errno 2] No such file: '/data/seg'"
