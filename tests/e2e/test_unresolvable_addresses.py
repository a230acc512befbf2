"""A commitlog given a host name that does not resolve stops at start with one line naming the
flag, its variable and the name (exit 2), as a bad setting does: never a traceback."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from scripts.launcher import MODULES, free_port


@pytest.mark.parametrize(("flag", "env"), [("--advertise", "QUARRY_COMMITLOG_ADVERTISE"), ("--store-host", "QUARRY_STORE_HOST")])
def test_a_name_that_does_not_resolve_stops_the_commitlog_in_one_line(tmp_path: Path, flag: str, env: str) -> None:
    host = "127.0.0.147"
    proc = subprocess.run([sys.executable, "-m", MODULES["commitlog"], "--bind", f"{host}:{free_port(host)}", "--store-dir", str(tmp_path / "s"),
                           flag, "no-such-host.invalid:10911"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "refusing to start" in lines[0] and f"{flag} [env {env}]" in lines[0] and "no-such-host.invalid" in lines[0]
