"""--grpc-poller (services/grpc_poller.py): grpc.aio's completion poller thread runs under
SCHED_BATCH, and only that thread; `normal` leaves every thread as it was; a bad value is
refused with the rule. Each case runs in a fresh interpreter, whose threads it may change."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from quarry.services import grpc_poller
from quarry.services.commitlog.config import parse_args as commitlog_args
from quarry.services.indexer.config import parse_args as indexer_args
from quarry.services.query.config import parse_args as router_args

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux's")

_PROBE = """
import asyncio, json, os, sys, threading
import grpc
from quarry.services import grpc_poller

async def main():
    server = grpc.aio.server()
    server.add_insecure_port("127.0.0.1:0")
    await server.start()
    before = {str(tid): os.sched_getscheduler(int(tid)) for tid in os.listdir("/proc/self/task")}
    done = grpc_poller.apply(sys.argv[1])
    pollers = {t.native_id for t in grpc_poller.poller_threads()}
    policies = {str(tid): os.sched_getscheduler(int(tid)) for tid in os.listdir("/proc/self/task")}
    print(json.dumps({"done": done, "pollers": sorted(pollers), "before": before, "policies": policies}))
    await server.stop(None)

asyncio.run(main())
"""


def _probe(policy: str) -> dict:  # type: ignore[type-arg]
    out = subprocess.run([sys.executable, "-c", _PROBE, policy], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_batch_puts_the_poller_thread_and_nothing_else_under_sched_batch() -> None:
    seen = _probe("batch")
    assert seen["done"] == "batch"
    assert len(seen["pollers"]) == 1
    poller = str(seen["pollers"][0])
    assert seen["policies"][poller] == os.SCHED_BATCH
    others = {tid: policy for tid, policy in seen["policies"].items() if tid != poller}
    assert others and all(policy == seen["before"].get(tid, policy) for tid, policy in others.items()), (others, seen["before"])


def test_normal_changes_no_thread() -> None:
    seen = _probe("normal")
    assert seen["done"] == "normal" and len(seen["pollers"]) == 1
    assert all(policy == seen["before"].get(tid, policy) for tid, policy in seen["policies"].items())


def test_without_a_poller_thread_it_says_so_and_changes_nothing() -> None:
    # No grpc.aio object made in this interpreter's probe: nothing to schedule.
    out = subprocess.run([sys.executable, "-c", "from quarry.services import grpc_poller; print(grpc_poller.apply('batch'))"],
                         capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "normal (no grpc.aio poller thread found)"


def test_an_unknown_policy_is_refused_with_the_rule() -> None:
    with pytest.raises(ValueError, match="poller policy: must be one of batch, normal, got 'fast'"):
        grpc_poller.apply("fast")


@pytest.mark.parametrize("parse", [commitlog_args, indexer_args, router_args])
def test_every_service_has_the_setting_batch_by_default(parse, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("QUARRY_GRPC_POLLER", raising=False)
    base = ["--index-dir", "/tmp/x", "--commitlog", "127.0.0.1:1"] if parse is indexer_args else []
    assert parse(base).grpc_poller == "batch"
    monkeypatch.setenv("QUARRY_GRPC_POLLER", "NORMAL")
    assert parse(base).grpc_poller == "normal"
    monkeypatch.setenv("QUARRY_GRPC_POLLER", "sometimes")
    with pytest.raises(SystemExit):
        parse(base)
    err = capsys.readouterr().err
    assert "--grpc-poller" in err and "QUARRY_GRPC_POLLER" in err and "must be one of batch, normal" in err
