"""End-to-end fixtures: real service processes on loopback, stopped and cleaned up after each test."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from services.launcher import ServiceProcess, free_port

Launch = Callable[..., ServiceProcess]


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Launch]:
    """launch(kind, *args, host='127.0.0.1', port=None) starts a service and waits until SERVING."""
    started: list[ServiceProcess] = []

    def _launch(kind: str, *args: str, host: str = "127.0.0.1", port: int | None = None, wait_s: float = 30.0) -> ServiceProcess:
        address = f"{host}:{port or free_port(host)}"
        proc = ServiceProcess(kind=kind, address=address, args=list(args), log_path=tmp_path / "logs" / f"{kind}-{len(started)}.log")
        started.append(proc)
        return proc.start(wait_s=wait_s)

    yield _launch
    for proc in reversed(started):
        proc.stop()
