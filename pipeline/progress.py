"""Progress while a job runs: records and bytes done per stage, printed every few seconds.

Tasks add to Spark accumulators (which reach the driver as each task finishes); a driver
thread prints one line per interval with the stage's task count, records, bytes and rate.
Corrupt-record reports travel back the same way, in a capped list accumulator.
"""
from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, Iterator

from pyspark.accumulators import AccumulatorParam

if TYPE_CHECKING:  # pragma: no cover
    from pyspark import SparkContext

MAX_REPORTS = 1000  # corrupt-record reports kept in full; the count is always exact


class ReportsParam(AccumulatorParam):  # type: ignore[type-arg]
    """Accumulates (count, [report, …]) keeping at most MAX_REPORTS reports."""

    def zero(self, value: Any) -> tuple[int, list[Any]]:
        return (0, [])

    def addInPlace(self, a: tuple[int, list[Any]], b: tuple[int, list[Any]]) -> tuple[int, list[Any]]:
        kept = a[1] + b[1][: max(0, MAX_REPORTS - len(a[1]))]
        return (a[0] + b[0], kept)


@dataclass
class StageCounters:
    """Accumulators one stage's tasks add to. Picklable into tasks."""

    records: Any
    bytes: Any
    corrupt: Any

    @classmethod
    def create(cls, sc: "SparkContext") -> "StageCounters":
        return cls(sc.accumulator(0), sc.accumulator(0), sc.accumulator((0, []), ReportsParam()))


@dataclass
class StageResult:
    name: str
    seconds: float
    records: int
    bytes: int
    tasks: int = 0


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def progress_line(job: str, stage: str, tasks_done: int, tasks_total: int, records: int, nbytes: int, total_bytes: int, elapsed: float) -> str:
    """One progress line: `[job] stage: tasks a/b, N records, X of Y, R records/s, T s`."""
    rate = records / elapsed if elapsed > 0 else 0.0
    of = f" of {human_bytes(total_bytes)}" if total_bytes else ""
    tasks = f"tasks {tasks_done}/{tasks_total}, " if tasks_total else ""
    return f"[{job}] {stage}: {tasks}{records:,} records, {human_bytes(nbytes)}{of}, {rate:,.0f} records/s, {elapsed:.1f} s"


@dataclass
class Progress:
    """Driver-side reporter. `with progress.stage(name, counters, total_bytes): …`."""

    sc: Any
    job: str
    interval_s: float = 5.0
    out: IO[str] = field(default_factory=lambda: sys.stderr)
    quiet: bool = False
    stages: list[StageResult] = field(default_factory=list)

    @contextmanager
    def stage(self, name: str, counters: StageCounters | None = None, total_bytes: int = 0) -> Iterator[None]:
        start = time.monotonic()
        stop = threading.Event()
        job_group = f"quarry-{self.job}-{name}"
        tracker = self.sc.statusTracker()
        self.sc.setJobGroup(job_group, f"{self.job}: {name}")

        def tasks() -> tuple[int, int]:
            done = total = 0
            try:
                for job_id in tracker.getJobIdsForGroup(job_group):
                    info = tracker.getJobInfo(job_id)
                    if info is None:
                        continue
                    for stage_id in info.stageIds:
                        st = tracker.getStageInfo(stage_id)
                        if st is not None:
                            done += st.numCompletedTasks
                            total += st.numTasks
            except Exception:  # noqa: BLE001 - progress must never fail a job
                pass
            return done, total

        def line() -> str:
            done, total = tasks()
            rec = counters.records.value if counters else 0
            nb = counters.bytes.value if counters else 0
            return progress_line(self.job, name, done, total, rec, nb, total_bytes, time.monotonic() - start)

        def loop() -> None:
            while not stop.wait(self.interval_s):
                self._print(line())

        thread = None
        if not self.quiet:
            self._print(f"[{self.job}] {name}: started")
            if self.interval_s > 0:
                thread = threading.Thread(target=loop, name=f"progress-{name}", daemon=True)
                thread.start()
        try:
            yield
        finally:
            stop.set()
            if thread is not None:
                thread.join()
            done, total = tasks()
            result = StageResult(
                name, time.monotonic() - start, counters.records.value if counters else 0, counters.bytes.value if counters else 0, total
            )
            self.stages.append(result)
            if not self.quiet:
                self._print(line().replace(f"{name}:", f"{name} done:", 1))
            try:
                self.sc._jsc.clearJobGroup()
            except Exception:  # noqa: BLE001
                pass

    def _print(self, text: str) -> None:
        print(text, file=self.out, flush=True)
