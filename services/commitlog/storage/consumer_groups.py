"""Consumer groups' pop state (RocketMQ 5 SimpleConsumer): per group, topic and queue, which
messages were looked at, which are in flight (received, invisible until T, attempt n), which
wait (a delayed message before its time, a FIFO message behind an unacked one of its message
group, one whose invisible time ran out and is due again), which were acked or dead-lettered.

Crash-safe by a journal: every change is one JSON line appended to `consumergroups/journal.<gen>`
and fsynced (group commit) before the caller answers its client, so an ack the client saw is
never undone and a delivery the client saw is never forgotten. The scan cursor (`next`) only
moves in the same line that records every message it passed that still needs delivering, so no
message is skipped. A snapshot (`state.json`, replaced atomically) names the journal generation
that follows it; the old journal is deleted only after the snapshot is durable. A torn last
line (a crash mid-write) was never answered to anyone and is dropped at open.

Plain Python over files; the RocketMQ 5 servicer (services/commitlog/doors/rmq5_consume.py) translates.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from quarry.formats.state_file import fsync_dir, write_json_atomic
from quarry.services.log import log_event

log = logging.getLogger("quarry.consumer_groups")

DIR_NAME = "consumergroups"
SNAPSHOT = "state.json"
COMPACT_BYTES = 8 << 20  # journal size that triggers a snapshot
KEEP_DONE = 100_000  # acked / dead-lettered times remembered per queue (for consume status)


@dataclass
class Pending:
    """A message of the group that still needs a delivery or an ack."""

    offset: int
    attempt: int  # deliveries so far; 0: never delivered (delayed, or behind its FIFO group)
    visible_at: int  # ms: invisible until (in flight) or due (waiting)
    msg_group: str = ""  # FIFO message group, "" when none
    received_at: int = 0  # ms of the last delivery
    nonce: int = 0  # names the last delivery (the receipt handle carries it)

    def row(self) -> list[Any]:
        return [self.offset, self.attempt, self.visible_at, self.msg_group, self.received_at, self.nonce]

    @classmethod
    def of(cls, row: list[Any]) -> "Pending":
        return cls(int(row[0]), int(row[1]), int(row[2]), str(row[3]), int(row[4]), int(row[5]))


@dataclass
class QueueState:
    next: int = 0  # first queue offset this group never looked at
    pending: dict[int, Pending] = field(default_factory=dict)
    acked: dict[int, int] = field(default_factory=dict)  # offset -> ack time (ms), recent ones
    dead: dict[int, int] = field(default_factory=dict)  # offset -> dead-letter time (ms)

    def committed(self) -> int:
        """Every offset below this is done for the group (acked, dead-lettered or filtered)."""
        return min(self.pending) if self.pending else self.next

    def blocked(self, p: Pending) -> bool:
        """A FIFO message waits for every earlier message of its message group."""
        if not p.msg_group:
            return False
        return any(o < p.offset and q.msg_group == p.msg_group for o, q in self.pending.items())


@dataclass
class GroupTopic:
    expression: str = "*"
    queues: dict[int, QueueState] = field(default_factory=dict)

    def queue(self, queue_id: int) -> QueueState:
        q = self.queues.get(queue_id)
        if q is None:
            q = self.queues[queue_id] = QueueState()
        return q


def _trim(done: dict[int, int]) -> None:
    if len(done) > KEEP_DONE:
        for o in sorted(done)[: len(done) - KEEP_DONE]:
            del done[o]


class ConsumerGroups:
    """Thread-safe; mutations are made durable by `sync()` (called by each mutating method)."""

    def __init__(self, store_dir: Path, read_only: bool = False, clock_ms: Callable[[], int] | None = None, fsync_each: bool = True) -> None:
        self.dir = Path(store_dir) / DIR_NAME
        self.read_only = read_only
        # SYNC stores fsync before answering; ASYNC ones, like their records, on the flush interval
        # (`flush`). Either way each change is written before the answer, so a SIGKILL loses none.
        self.fsync_each = fsync_each
        self.clock = clock_ms or (lambda: int(time.time() * 1000))
        self._lock = threading.RLock()
        self._sync_lock = threading.Lock()
        self._groups: dict[tuple[str, str], GroupTopic] = {}  # (group, topic)
        self._gen = 0
        self._fd: int | None = None
        self._written = 0
        self._synced = 0
        self._nonce = int(time.time() * 1000) & 0xFFFFFFFF
        self._closing = threading.Event()
        self._load()
        if not fsync_each and not read_only:
            threading.Thread(target=self._flush_every, args=(0.5,), name="consumer-groups-flush", daemon=True).start()

    # -- files ------------------------------------------------------------------------------
    def _journal_path(self, gen: int) -> Path:
        return self.dir / f"journal.{gen}"

    def _load(self) -> None:
        snap = self.dir / SNAPSHOT
        if snap.exists():
            data = json.loads(snap.read_text())
            self._gen = int(data["gen"])
            for entry in data["groups"]:
                gt = self._groups.setdefault((entry["g"], entry["t"]), GroupTopic())
                gt.expression = entry.get("x", "*")
                for qid, qd in entry["q"].items():
                    q = gt.queue(int(qid))
                    q.next = int(qd["n"])
                    q.pending = {p.offset: p for p in map(Pending.of, qd["p"])}
                    q.acked = {int(o): int(t) for o, t in qd.get("k", [])}
                    q.dead = {int(o): int(t) for o, t in qd.get("d", [])}
        path = self._journal_path(self._gen)
        if path.exists():
            raw = path.read_bytes()
            good = 0
            for line in raw.split(b"\n"):
                end = good + len(line) + 1
                if end > len(raw):  # no newline: a torn last write
                    break
                try:
                    self._apply(json.loads(line))
                except (ValueError, KeyError, TypeError, IndexError):
                    break
                good = end
            if good < len(raw) and not self.read_only:
                log_event(log, "consumer group journal: torn tail dropped", logging.WARNING, path=str(path), dropped_bytes=len(raw) - good)
                with open(path, "r+b") as fh:
                    fh.truncate(good)
                    os.fsync(fh.fileno())
        if not self.read_only:
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._open(self._gen)
            for stale in self.dir.glob("journal.*"):  # a crash after a snapshot, before the delete
                if stale.name != path.name:
                    stale.unlink()

    def _open(self, gen: int) -> None:
        path = self._journal_path(gen)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._written = self._synced = os.fstat(self._fd).st_size
        fsync_dir(self.dir)

    def _log(self, op: dict[str, Any]) -> None:
        """Apply one change and append it to the journal (under the lock)."""
        self._apply(op)
        if self.read_only or self._fd is None:
            return
        line = json.dumps(op, separators=(",", ":")).encode() + b"\n"
        os.write(self._fd, line)
        self._written += len(line)

    def sync(self) -> None:
        """Make what was logged so far durable before answering: written already (a process
        crash loses nothing); fsynced too when `fsync_each` (one fsync serves every caller waiting)."""
        if self.fsync_each:
            self.flush()

    def _flush_every(self, interval_s: float) -> None:
        while not self._closing.wait(interval_s):
            try:
                self.flush()
            except OSError as exc:
                log_event(log, "consumer group journal fsync failed", logging.ERROR, error=str(exc))

    def flush(self) -> None:
        """fsync what was logged so far (the store's flusher calls it on its interval)."""
        if self.read_only or self._fd is None:
            return
        target = self._written
        with self._sync_lock:
            if self._synced >= target:
                return
            with self._lock:
                fd, end = self._fd, self._written
            if fd is None:
                return
            os.fsync(fd)
            self._synced = max(self._synced, end)
        if end > COMPACT_BYTES:
            self.compact()

    def compact(self) -> None:
        """Snapshot the state, start a new journal, drop the old one."""
        with self._sync_lock, self._lock:
            if self.read_only or self._fd is None:
                return
            os.fsync(self._fd)
            gen = self._gen + 1
            write_json_atomic(self.dir / SNAPSHOT, {"gen": gen, "groups": self._snapshot_rows()})
            os.close(self._fd)
            old = self._journal_path(self._gen)
            self._gen = gen
            self._open(gen)
            old.unlink(missing_ok=True)
            fsync_dir(self.dir)

    def _snapshot_rows(self) -> list[dict[str, Any]]:
        rows = []
        for (g, t), gt in sorted(self._groups.items()):
            rows.append({"g": g, "t": t, "x": gt.expression, "q": {
                str(qid): {"n": q.next, "p": [p.row() for p in sorted(q.pending.values(), key=lambda p: p.offset)],
                           "k": sorted(q.acked.items()), "d": sorted(q.dead.items())}
                for qid, q in sorted(gt.queues.items())}})
        return rows

    def close(self) -> None:
        self._closing.set()
        with self._sync_lock, self._lock:
            if self._fd is not None:
                os.fsync(self._fd)
                os.close(self._fd)
                self._fd = None

    # -- the one mutation ---------------------------------------------------------------------
    def _apply(self, op: dict[str, Any]) -> None:
        """op: g, t, optional x (expression); for a queue q: optional r (the queue was cut there:
        nothing at or past it is known), n (new cursor), p (pending rows set), k / d ([offset, ms]
        acked / dead-lettered: no longer pending)."""
        gt = self._groups.setdefault((op["g"], op["t"]), GroupTopic())
        if "x" in op:
            gt.expression = op["x"]
        if "q" not in op:
            return
        q = gt.queue(int(op["q"]))
        if "r" in op:
            cut = int(op["r"])
            q.next = min(q.next, cut)
            for known in (q.pending, q.acked, q.dead):
                for o in [o for o in known if o >= cut]:
                    del known[o]
        if "n" in op:
            q.next = max(q.next, int(op["n"]))
        for row in op.get("p", ()):
            p = Pending.of(row)
            q.pending[p.offset] = p
        for o, ms in op.get("k", ()):
            q.pending.pop(o, None)
            q.acked[o] = ms
        for o, ms in op.get("d", ()):
            q.pending.pop(o, None)
            q.dead[o] = ms
        if "k" in op:
            _trim(q.acked)
        if "d" in op:
            _trim(q.dead)

    # -- what the servicer calls -------------------------------------------------------------
    def new_nonce(self) -> int:
        with self._lock:
            self._nonce = (self._nonce + 1) & 0x7FFFFFFF
            return self._nonce

    def subscribe(self, group: str, topic: str, expression: str) -> None:
        with self._lock:
            gt = self._groups.get((group, topic))
            if gt is None or gt.expression != expression:
                self._log({"g": group, "t": topic, "x": expression})

    def lock(self) -> threading.RLock:
        return self._lock

    def queue_view(self, group: str, topic: str, queue_id: int) -> QueueState:
        """The live state (read it under `lock()`)."""
        with self._lock:
            return self._groups.setdefault((group, topic), GroupTopic()).queue(queue_id)

    def record(self, group: str, topic: str, queue_id: int, *, next_offset: int | None = None,
               pending: Sequence[Pending] = (), acked: Sequence[tuple[int, int]] = (), dead: Sequence[tuple[int, int]] = ()) -> None:
        """Log one change of a queue (caller holds `lock()` when it read the state it changes)."""
        op: dict[str, Any] = {"g": group, "t": topic, "q": queue_id}
        if next_offset is not None:
            op["n"] = next_offset
        if pending:
            op["p"] = [p.row() for p in pending]
        if acked:
            op["k"] = [list(a) for a in acked]
        if dead:
            op["d"] = [list(d) for d in dead]
        with self._lock:
            self._log(op)

    def rewind(self, group: str, topic: str, queue_id: int, end: int) -> None:
        """The queue now ends at `end` (the log was cut): forget what the group knew at or past it."""
        with self._lock:
            self._log({"g": group, "t": topic, "q": queue_id, "r": end})

    def groups_of(self, topic: str) -> dict[str, GroupTopic]:
        with self._lock:
            return {g: gt for (g, t), gt in self._groups.items() if t == topic}

    def all(self) -> Iterator[tuple[str, str, GroupTopic]]:
        with self._lock:
            items = list(self._groups.items())
        for (g, t), gt in items:
            yield g, t, gt
