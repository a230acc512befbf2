"""Follow mode against a separate writer process (tests/store_writer.py) that writes a store
directory as a RocketMQ broker does: preallocated zero-filled 4 KiB segments, records written
in pieces through mmap, segments closed by a blank and expired. A commitlog started with
--follow (and its indexer) serves it through the router: each record is found by
offsetMsgId, key, unique key and queue offset soon after it is written (a deadline, not a
measured duration); the writer killed in the middle of a record is followed again after its
restart; expired segments move the minimum offset and answer OUT_OF_RANGE; the commitlog
holds every file of the directory open read-only and no file changes."""
from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from quarry.channels import open_channel
from quarry.clients.admin import AdminClient
from quarry.formats.record import SYSFLAG_TRANSACTION_MASK, SYSFLAG_TRANSACTION_ROLLBACK, takes_queue_offset
from quarry.formats.segment_walk import list_segments
from quarry.formats.topic import is_valid_topic
from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, router_pb2
from tests.e2e.conftest import wait_until
from tests.tree import tree_snapshot
from tests.vectors import REPO_ROOT

GOLDEN = REPO_ROOT / "tests" / "golden" / "messages"
SCENARIOS = sorted(p.parent.name for p in GOLDEN.glob("*/scenario.json"))
WIDENED_UNIQUE_KEY_SEARCH = "begin_timestamp" in router_pb2.QueryMsgByUniqueKeyRequest.DESCRIPTOR.fields_by_name
BROKER_HOST = "10.20.30.40:10911"  # the RocketMQ broker's address, in the ids it issued
FOUND_WITHIN_S = 20.0  # a deadline on a loaded 2-core machine; the follower polls every 100 ms


class WriterProcess:
    """tests/store_writer.py as a child process; its JSON lines arrive on a queue."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.store_writer", *args], cwd=REPO_ROOT,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.lines: queue.Queue[dict[str, object]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))

    def next(self) -> dict[str, object]:
        try:
            return self.lines.get(timeout=60)
        except queue.Empty:
            pytest.fail(f"the writer said nothing for 60 s (exit code {self.proc.poll()})")

    def step(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def writers() -> Iterator[list[WriterProcess]]:
    made: list[WriterProcess] = []
    yield made
    for w in made:
        if w.proc.poll() is None:
            w.kill()


def _open_files(pid: int, under: Path) -> list[tuple[str, int]]:
    """(path, open flags) of every descriptor of process `pid` on a file under `under`."""
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            info = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
        except FileNotFoundError:
            continue  # closed meanwhile
        if target.startswith(str(under)):
            out.append((target, int(info.split("flags:")[1].split()[0], 8)))
    return out


def _assert_read_only_access(pid: int, store: Path) -> int:
    """Every file of the store the process holds is open O_RDONLY, and it holds no lock."""
    files = _open_files(pid, store)
    for path, flags in files:
        assert flags & os.O_ACCMODE == os.O_RDONLY, f"{path} is open with flags {flags:o}"
    locks = [line for line in Path("/proc/locks").read_text().splitlines() if line.split()[4:5] == [str(pid)]]
    assert not locks, f"the commitlog holds locks: {locks}"
    return len(files)


def _commitlog(address: str) -> commitlog_pb2_grpc.CommitLogServiceStub:
    return commitlog_pb2_grpc.CommitLogServiceStub(open_channel(address))


def _follow_cluster(cluster_factory, store: Path, host: str, store_host: str, *more: str):  # type: ignore[no-untyped-def]
    cluster = cluster_factory(indexer_args=["--hash-slots", "101", "--index-num", "2000", "--flush-interval-ms", "100"])
    cluster.start_router()
    broker = cluster.add_broker("followed", host, commitlog_args=[
        "--store-dir", str(store), "--follow", "true", "--follow-interval-ms", "100", "--store-host", store_host, *more])
    return cluster, broker


def _found(admin: AdminClient, broker: str, rec: dict[str, object], unique_key: bool = True) -> bool:
    msg_id = rec["msg_id"]
    by_id = admin.query_by_id(str(msg_id)).messages
    if [m.commit_log_offset for m in by_id] != [rec["offset"]]:
        return False
    if str(msg_id) not in {m.offset_msg_id for m in admin.query_by_key(str(rec["topic"]), str(rec["key"]), max_num=64).messages}:
        return False
    if unique_key and str(msg_id) not in {m.offset_msg_id for m in admin.query_by_unique_key(str(rec["topic"]), str(rec["uniq_key"]), return_all=True).messages}:
        return False
    at = admin.query_by_offset(str(rec["topic"]), broker, int(rec["queue_id"]), int(rec["queue_offset"])).messages  # type: ignore[call-overload]
    return [m.offset_msg_id for m in at] == [msg_id]


def test_a_live_writer_is_followed_through_a_crash_and_expiry(tmp_path: Path, cluster_factory, writers) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "rocketmq-store"
    args = ["generate", "--store-dir", str(store), "--segment-size", "4096", "--count", "90", "--keep-segments", "3",
            "--store-host", BROKER_HOST, "--cq-units", "8", "--step"]
    first = WriterProcess(*args, "--stop-mid-record", "45")
    writers.append(first)
    cluster, broker = _follow_cluster(cluster_factory, store, "127.0.0.71", BROKER_HOST, "--cq-units-per-file", "8")
    pid = broker.commitlog.proc.pid
    status = _commitlog(broker.commitlog.address)
    written: list[dict[str, object]] = []
    deleted: list[str] = []

    def follow(writer: WriterProcess) -> dict[str, object]:
        """Check each record the writer reports until it reports something else; return that."""
        with AdminClient(cluster.router.address) as admin:
            while True:
                line = writer.next()
                if "deleted" in line:
                    deleted.append(str(line["deleted"]))
                    continue
                if "offset" not in line:
                    return line
                written.append(line)
                wait_until(lambda: _found(admin, "followed", line), timeout_s=FOUND_WITHIN_S, what=f"record {line['n']} found 4 ways")
                if len(written) % 15 == 0:
                    assert _assert_read_only_access(pid, store) > 0
                writer.step()

    mid = follow(first)
    assert "mid_record" in mid and len(written) == 45
    first.kill()  # in the middle of record 45
    # What was whole is served; the torn record is not (the end stays at its start).
    end = status.GetStoreStatus(commitlog_pb2.GetStoreStatusRequest(), timeout=10)
    assert end.max_offset == mid["mid_record"]

    second = WriterProcess(*args)
    writers.append(second)
    recovered = second.next()
    assert recovered == {"recovered": mid["mid_record"], "records": 45}
    done = follow(second)
    assert "done" in done and [r["n"] for r in written] == list(range(90))
    wait_until(lambda: status.GetStoreStatus(commitlog_pb2.GetStoreStatusRequest(), timeout=10).max_offset == done["done"], what="the end followed")

    # Expiry: the writer deleted its oldest segments; the minimum moved and reads there are out of range.
    assert deleted
    oldest_kept = list_segments(store / "commitlog")[0][0]
    st = status.GetStoreStatus(commitlog_pb2.GetStoreStatusRequest(), timeout=10)
    assert st.min_offset == oldest_kept > 0
    with pytest.raises(grpc.RpcError) as err:
        status.ViewMessage(commitlog_pb2.ViewMessageRequest(physical_offset=int(written[0]["offset"])), timeout=10)
    assert err.value.code() == grpc.StatusCode.OUT_OF_RANGE

    # Never written, locked or created in: every descriptor read-only, nothing changed by Quarry.
    assert _assert_read_only_access(pid, store) > 0
    # The writer's own ConsumeQueue files are read (those it lacks after its crash come from memory).
    assert any("/consumequeue/" in path for path, _flags in _open_files(pid, store))
    second.kill()
    before = tree_snapshot(store)
    assert {name for name in before if not name.startswith("consumequeue")} == {
        "commitlog", *(f"commitlog/{p.name}" for _s, p in list_segments(store / "commitlog"))}
    cluster.stop()
    assert tree_snapshot(store) == before


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_golden_segments_fed_progressively_are_followed(scenario: str, tmp_path: Path, cluster_factory, writers) -> None:  # type: ignore[no-untyped-def]
    golden = json.loads((GOLDEN / scenario / "scenario.json").read_text())
    by_offset = {r["decoded"]["commit_log_offset"]: r["decoded"] for m in golden["messages"] for r in m["records"]}
    first_host = next(iter(by_offset.values()))["store_host"]
    store = tmp_path / "rocketmq-store"
    (store / "commitlog").mkdir(parents=True)
    store_host = first_host if ":" not in first_host.rpartition(":")[0] else "[{}]:{}".format(*first_host.rsplit(":", 1))
    cluster, broker = _follow_cluster(cluster_factory, store, "127.0.0.72", store_host)
    writer = WriterProcess("golden", "--store-dir", str(store), "--segments-of", str(GOLDEN / scenario / "commitlog"), "--step")
    writers.append(writer)
    with AdminClient(cluster.router.address) as admin:
        while "offset" in (line := writer.next()):
            rec = by_offset[line["offset"]]
            label = f"{scenario} record at {rec['commit_log_offset']}"
            wait_until(lambda: [m.commit_log_offset for m in admin.query_by_id(rec["msg_id"]).messages] == [rec["commit_log_offset"]],
                       timeout_s=FOUND_WITHIN_S, what=f"{label} by id")
            if is_valid_topic(rec["topic"]) and rec["sys_flag"] & SYSFLAG_TRANSACTION_MASK != SYSFLAG_TRANSACTION_ROLLBACK:
                for key in (rec["keys"] or "").split(" "):
                    if key:
                        wait_until(lambda: rec["msg_id"] in {m.offset_msg_id for m in admin.query_by_key(rec["topic"], key, max_num=64).messages},
                                   timeout_s=FOUND_WITHIN_S, what=f"{label}: key {key}")
                if rec["uniq_key"] and WIDENED_UNIQUE_KEY_SEARCH:
                    wait_until(lambda: rec["msg_id"] in {m.offset_msg_id for m in admin.query_by_unique_key(rec["topic"], rec["uniq_key"], return_all=True).messages},
                               timeout_s=FOUND_WITHIN_S, what=f"{label}: unique key")
            if is_valid_topic(rec["topic"]) and takes_queue_offset(rec["sys_flag"]):
                wait_until(lambda: [m.offset_msg_id for m in admin.query_by_offset(rec["topic"], "followed", rec["queue_id"], rec["queue_offset"]).messages] == [rec["msg_id"]],
                           timeout_s=FOUND_WITHIN_S, what=f"{label}: queue offset")
            writer.step()
    assert line == {"done": True}
    assert _assert_read_only_access(broker.commitlog.proc.pid, store) > 0
    # The followed files are the golden segments byte for byte: the writer reproduced them and
    # Quarry changed nothing.
    for start, path in list_segments(GOLDEN / scenario / "commitlog"):
        assert (store / "commitlog" / path.name).read_bytes() == path.read_bytes()
    cluster.stop()


def test_keys_answered_from_the_brokers_own_index_files(tmp_path: Path, cluster_factory, writers) -> None:  # type: ignore[no-untyped-def]
    """--follow-index: the indexer keeps no IndexFiles of its own; it maps the broker's index/
    (written by the writer process as RocketMQ's IndexService does, rolling to new files)."""
    store = tmp_path / "rocketmq-store"
    writer = WriterProcess("generate", "--store-dir", str(store), "--segment-size", "4096", "--count", "40", "--store-host", BROKER_HOST,
                           "--index", "--hash-slots", "101", "--index-num", "30", "--step")
    writers.append(writer)
    cluster = cluster_factory()
    cluster.start_router()
    broker = cluster.add_broker("followed", "127.0.0.73",
                                commitlog_args=["--store-dir", str(store), "--follow", "true", "--store-host", BROKER_HOST],
                                indexer_args=["--index-dir", str(store), "--follow-index", "true", "--follow-interval-ms", "100",
                                              "--hash-slots", "101", "--index-num", "30"])
    index_files: list[str] = []
    with AdminClient(cluster.router.address) as admin:
        while "done" not in (line := writer.next()):
            if "index_file" in line:
                index_files.append(str(line["index_file"]))
                continue
            wait_until(lambda: _found(admin, "followed", line), timeout_s=FOUND_WITHIN_S, what=f"record {line['n']} found 4 ways")
            writer.step()
    assert len(index_files) >= 2  # the broker rolled to new IndexFiles while followed
    for pid in (broker.indexer.proc.pid, broker.commitlog.proc.pid):
        assert _assert_read_only_access(pid, store) > 0
    assert not (broker.index_dir / "index").exists()  # no second copy of the index
    writer.kill()
    before = tree_snapshot(store)
    assert set(before) == {"commitlog", "index", *(f"commitlog/{p.name}" for _s, p in list_segments(store / "commitlog")),
                           *(f"index/{name}" for name in index_files)}
    cluster.stop()
    assert tree_snapshot(store) == before


def _recover_as_rocketmq(commitlog: Path, cut: int) -> list[str]:
    """What a RocketMQ broker's recovery leaves after a crash that lost its records from `cut`
    on (MappedFileQueue.truncateDirtyFiles): the files after the one holding the cut deleted
    (the preallocated next one too), and that one's bytes from the cut on zeroed in place.
    Returns the names deleted."""
    segments = list_segments(commitlog)
    holding, path = max((s, p) for s, p in segments if s <= cut)
    deleted = []
    for start, later in segments:
        if start > holding:
            later.unlink()
            deleted.append(later.name)
    with open(path, "r+b") as fh:
        fh.seek(cut - holding)
        fh.write(bytes(path.stat().st_size - (cut - holding)))
    return deleted


def test_records_written_after_a_crash_recovery_that_cut_the_log_back_are_found(tmp_path: Path, cluster_factory, writers) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "rocketmq-store"
    args = ["generate", "--store-dir", str(store), "--segment-size", "4096", "--count", "70", "--store-host", BROKER_HOST,
            "--cq-units", "8", "--step"]
    first = WriterProcess(*args, "--stop-mid-record", "30")
    writers.append(first)
    cluster, broker = _follow_cluster(cluster_factory, store, "127.0.0.74", BROKER_HOST, "--cq-units-per-file", "8")
    status = _commitlog(broker.commitlog.address)
    written: list[dict[str, object]] = []
    with AdminClient(cluster.router.address) as admin:
        while "offset" in (line := first.next()):
            written.append(line)
            wait_until(lambda: _found(admin, "followed", line), timeout_s=FOUND_WITHIN_S, what=f"record {line['n']} found 4 ways")
            first.step()
        assert "mid_record" in line and len(written) == 30
        first.kill()

        # The crash lost records 27, 28 and 29 (served already): the broker's recovery ends its
        # log before them and deletes the files after it, and the follower drops them.
        cut = int(written[27]["offset"])
        deleted = _recover_as_rocketmq(store / "commitlog", cut)
        assert deleted  # at least the next file, allocated ahead
        wait_until(lambda: status.GetStoreStatus(commitlog_pb2.GetStoreStatusRequest(), timeout=10).max_offset == cut,
                   timeout_s=FOUND_WITHIN_S, what="the follower's end cut back with the writer's")
        reported = [c for c in status.GetStoreStatus(commitlog_pb2.GetStoreStatusRequest(), timeout=10).corruption if "cut back" in c]
        assert len(reported) == 1 and f"cut back to {cut}" in reported[0] and "3 records" in reported[0], reported
        with pytest.raises(grpc.RpcError) as err:
            status.ViewMessage(commitlog_pb2.ViewMessageRequest(physical_offset=int(written[28]["offset"])), timeout=10)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND

        # The restarted broker writes from the cut, into files it allocates again under the
        # deleted ones' names: every record is found by its offset (and by key and queue offset).
        second = WriterProcess(*args)
        writers.append(second)
        assert second.next() == {"recovered": cut, "records": 27}
        again: list[dict[str, object]] = []
        while "offset" in (line := second.next()):
            again.append(line)
            # The indexer's Tail ended at the cut and its index was checked against the log:
            # 27..29 are indexed again (same keys, new unique keys), found by their unique keys too.
            wait_until(lambda: _found(admin, "followed", line, unique_key=True), timeout_s=FOUND_WITHIN_S,
                       what=f"record {line['n']} written after the recovery found")
            second.step()
    assert "done" in line and [r["n"] for r in again] == list(range(27, 70))
    assert set(deleted) <= {p.name for _s, p in list_segments(store / "commitlog")}  # allocated again under their names
    wait_until(lambda: status.GetStoreStatus(commitlog_pb2.GetStoreStatusRequest(), timeout=10).max_offset == line["done"], what="the end followed")
    pid = broker.commitlog.proc.pid
    # The deleted files are let go of (one round later): no descriptor on a "(deleted)" file.
    wait_until(lambda: not [path for path, _flags in _open_files(pid, store) if path.endswith("(deleted)")], what="deleted files closed")
    assert _assert_read_only_access(pid, store) > 0
    second.kill()
    cluster.stop()
