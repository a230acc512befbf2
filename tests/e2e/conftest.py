"""End-to-end fixtures: real service processes on loopback, stopped and cleaned up after each test."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any
from pathlib import Path

import pytest

from quarry.clients.admin import AdminClient
from scripts.launcher import LocalCluster, ServiceProcess, free_port

Launch = Callable[..., ServiceProcess]


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Launch]:
    """launch(kind, *args, host='127.0.0.1', port=None) starts a service and waits until SERVING."""
    started: list[ServiceProcess] = []

    def _launch(kind: str, *args: str, host: str = "127.0.0.1", port: int | None = None, wait_s: float = 30.0, serving_only: bool = True) -> ServiceProcess:
        address = f"{host}:{port or free_port(host)}"
        proc = ServiceProcess(kind=kind, address=address, args=list(args), log_path=tmp_path / "logs" / f"{kind}-{len(started)}.log")
        started.append(proc)
        return proc.start(wait_s=wait_s, serving_only=serving_only)

    yield _launch
    for proc in reversed(started):
        proc.stop()


def launch_with_acl(launch: Launch, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, accounts: list[dict], kind: str, *args: str, **kwargs: Any) -> ServiceProcess:  # type: ignore[type-arg]
    """launch(kind, *args, **kwargs) with QUARRY_ACL_FILE holding these accounts; only that service sees it."""
    (tmp_path / "acl.json").write_text(json.dumps({"accounts": accounts}))
    monkeypatch.setenv("QUARRY_ACL_FILE", str(tmp_path / "acl.json"))
    try:
        return launch(kind, *args, **kwargs)
    finally:
        monkeypatch.delenv("QUARRY_ACL_FILE")


def run_quarry(router: str | None, *args: str, timeout_s: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The `quarry` CLI in its own process with NAMESRV_ADDR=router (unset when None), run outside the
    source tree so that it works from the installed package alone."""
    full = {**os.environ, **(env or {})}
    full.pop("NAMESRV_ADDR", None)
    if router:
        full["NAMESRV_ADDR"] = router
    return subprocess.run([sys.executable, "-m", "quarry.clients", *args], capture_output=True, text=True, env=full, timeout=timeout_s,
                          cwd=tempfile.gettempdir())


def wait_until(predicate: Callable[[], object], timeout_s: float = 20.0, what: str = "condition", interval_s: float = 0.05) -> object:
    """Poll predicate until it returns a truthy value (returned) or fail at the deadline."""
    import threading
    import time

    end = time.monotonic() + timeout_s
    pause = threading.Event()
    last_exc: Exception | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # a service still starting answers with errors; keep waiting
            last_exc = exc
        if time.monotonic() >= end:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}" + (f" (last error: {last_exc})" if last_exc else ""))
        pause.wait(interval_s)


@pytest.fixture(scope="module")
def admin(cluster: LocalCluster) -> Iterator[AdminClient]:
    """An AdminClient on the router of the module's `cluster`."""
    assert cluster.router is not None
    with AdminClient(cluster.router.address) as a:
        yield a


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[Callable[..., "LocalCluster"]]:
    """cluster_factory(commitlog_args=[...], indexer_args=[...]) → a LocalCluster stopped after the test."""
    from scripts.launcher import LocalCluster

    made: list[LocalCluster] = []

    def _make(commitlog_args: list[str] | None = None, indexer_args: list[str] | None = None) -> LocalCluster:
        c = LocalCluster(root=tmp_path / f"cluster{len(made)}", commitlog_args=commitlog_args or [], indexer_args=indexer_args or [])
        made.append(c)
        return c

    yield _make
    for c in made:
        c.stop()
