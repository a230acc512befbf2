"""--grpc-poller in the service processes: a commitlog and a router each run grpc.aio's poller
thread, and only it, under SCHED_BATCH by default, say so in their `server started` line, and
keep every thread as it was with `--grpc-poller normal`."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from scripts.launcher import ServiceProcess
from tests.e2e.conftest import Launch

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux's"),
    # The services inherit this process's policy: under SCHED_BATCH already, no thread can stand out.
    pytest.mark.skipif(hasattr(os, "SCHED_BATCH") and os.sched_getscheduler(0) == os.SCHED_BATCH, reason="the test runs under SCHED_BATCH"),
]


def _policies(proc: ServiceProcess) -> dict[int, int]:
    assert proc.proc is not None
    pid = proc.proc.pid
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out[int(tid)] = os.sched_getscheduler(int(tid))
        except ProcessLookupError:  # a short-lived thread ended meanwhile
            pass
    return out


@pytest.mark.parametrize("kind", ["commitlog", "router"])
def test_the_poller_thread_alone_runs_as_a_batch_thread(launch: Launch, tmp_path: Path, kind: str) -> None:
    args = ["--store-dir", str(tmp_path / "store"), "--segment-size", str(1 << 20)] if kind == "commitlog" else []
    proc = launch(kind, *args)
    assert proc.proc is not None
    policies = _policies(proc)
    batch = [tid for tid, policy in policies.items() if policy == os.SCHED_BATCH]
    assert len(batch) == 1 and batch[0] != proc.proc.pid, policies  # not the event loop's (main) thread
    assert "grpc_poller=batch" in proc.log_path.read_text()


def test_normal_leaves_every_thread_as_it_was(launch: Launch, tmp_path: Path) -> None:
    proc = launch("commitlog", "--store-dir", str(tmp_path / "store"), "--segment-size", str(1 << 20), "--grpc-poller", "normal")
    assert all(policy == os.sched_getscheduler(0) for policy in _policies(proc).values())  # as it inherited them
    assert "grpc_poller=normal" in proc.log_path.read_text()
