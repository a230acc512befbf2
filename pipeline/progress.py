"""Progress while a job runs: records and bytes done per stage, printed every few seconds.

Tasks add to Spark accumulators, which reach the driver only as each task finishes; so
while a task reads, it also sends its running counts to the driver every half second in a
small UDP datagram (best effort: a lost datagram only delays a line, and nothing a task
does can fail because of it). A driver thread prints one line per interval with the
stage's tasks, records, bytes read of the total, percent, rate and the time left (ETA).
Corrupt-record reports travel back in a capped list accumulator.
"""
from __future__ import annotations

import socket
import sys
import threading
import time
import uuid
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


TICK_SECONDS = 0.5  # how often a task reports its running counts


class Ticker:
    """Task side: sends (token, split, records, bytes) to the driver at most every TICK_SECONDS."""

    def __init__(self, live: tuple[str, int, str], split_index: int) -> None:
        self.address = (live[0], live[1])
        self.prefix = f"{live[2]} {split_index} "
        self.next_at = 0.0
        self.sock: socket.socket | None = None

    def tick(self, records: int, nbytes: int, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now < self.next_at:
            return
        self.next_at = now + TICK_SECONDS
        try:
            if self.sock is None:
                self.sock = socket.socket(socket.AF_INET6 if ":" in self.address[0] else socket.AF_INET, socket.SOCK_DGRAM)
            self.sock.sendto(f"{self.prefix}{records} {nbytes}".encode(), self.address)
        except OSError:
            pass  # progress must never fail a task
        if final and self.sock is not None:
            self.sock.close()
            self.sock = None


class LiveCounts:
    """Driver side: the latest running counts of every split of every stage, from the tasks' datagrams."""

    def __init__(self, host: str) -> None:
        self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, 0))
        self.address: tuple[str, int] = (host, self.sock.getsockname()[1])
        self.counts: dict[tuple[str, int], tuple[int, int]] = {}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._receive, name="progress-receiver", daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while True:
            try:
                data = self.sock.recv(256)
            except OSError:
                return  # closed
            try:
                token, split, records, nbytes = data.decode().split()
                key, value = (token, int(split)), (int(records), int(nbytes))
            except ValueError:
                continue  # not ours
            with self._lock:
                old = self.counts.get(key)
                if old is None or value >= old:  # datagrams may arrive out of order
                    self.counts[key] = value

    def totals(self, token: str) -> tuple[int, int]:
        with self._lock:
            values = [v for (t, _), v in self.counts.items() if t == token]
        return sum(v[0] for v in values), sum(v[1] for v in values)

    def close(self) -> None:
        self.sock.close()


@dataclass
class StageCounters:
    """Accumulators one stage's tasks add to, and where they report running counts. Picklable into tasks."""

    records: Any
    bytes: Any
    corrupt: Any
    live: tuple[str, int, str] | None = None  # driver host, port, this stage's token

    @classmethod
    def create(cls, sc: "SparkContext", live: tuple[str, int] | None = None) -> "StageCounters":
        token = (live[0], live[1], uuid.uuid4().hex[:12]) if live is not None else None
        return cls(sc.accumulator(0), sc.accumulator(0), sc.accumulator((0, []), ReportsParam()), token)

    def ticker(self, split_index: int) -> Ticker | None:
        return Ticker(self.live, split_index) if self.live is not None else None


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


def human_seconds(s: float) -> str:
    s = max(0, int(round(s)))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def progress_line(job: str, stage: str, tasks_done: int, tasks_total: int, records: int, nbytes: int, total_bytes: int, elapsed: float) -> str:
    """One progress line: `[job] stage: tasks a/b, N records, X of Y (P%), R records/s, T s, ETA E`."""
    rate = records / elapsed if elapsed > 0 else 0.0
    of = ""
    eta = ""
    if total_bytes:
        done = min(nbytes, total_bytes)
        of = f" of {human_bytes(total_bytes)} ({100.0 * done / total_bytes:.1f}%)"
        if 0 < done < total_bytes and elapsed > 0:
            eta = f", ETA {human_seconds(elapsed * (total_bytes - done) / done)}"
    tasks = f"tasks {tasks_done}/{tasks_total}, " if tasks_total else ""
    return f"[{job}] {stage}: {tasks}{records:,} records, {human_bytes(nbytes)}{of}, {rate:,.0f} records/s, {elapsed:.1f} s{eta}"


@dataclass
class Progress:
    """Driver-side reporter. `with progress.stage(name, counters, total_bytes): …`."""

    sc: Any
    job: str
    interval_s: float = 5.0
    out: IO[str] = field(default_factory=lambda: sys.stderr)
    quiet: bool = False
    stages: list[StageResult] = field(default_factory=list)
    live: LiveCounts | None = None

    def live_address(self) -> tuple[str, int] | None:
        """Where tasks send running counts (started on first use; None when quiet or it cannot bind)."""
        if self.quiet or self.interval_s <= 0:
            return None
        if self.live is None:
            try:
                host = self.sc.getConf().get("spark.driver.host") or "127.0.0.1"
                self.live = LiveCounts(host)
            except (OSError, Exception):  # noqa: BLE001 - progress must never fail a job
                return None
        return self.live.address

    def close(self) -> None:
        if self.live is not None:
            self.live.close()
            self.live = None

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
            if counters is not None and counters.live is not None and self.live is not None:
                live_rec, live_nb = self.live.totals(counters.live[2])  # includes tasks still reading
                rec, nb = max(rec, live_rec), max(nb, live_nb)
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
