"""A newcomer's first minutes (issue 15 item 24): `make run`'s demo keeps serving until
Ctrl-C when it runs in a terminal (and `quarry` works meanwhile, as it says), and stops at
once, saying so, when it does not."""
from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.e2e.conftest import run_quarry

REPO_ROOT = Path(__file__).resolve().parents[2]


def _read_until(fd: int, pattern: str, timeout_s: float = 120.0) -> str:
    """Read the terminal until `pattern` appears (a deadline, not a sleep)."""
    text = ""
    end = time.monotonic() + timeout_s
    while not re.search(pattern, text):
        left = end - time.monotonic()
        assert left > 0, f"no {pattern!r} within {timeout_s}s; got:\n{text}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            text += chunk.decode(errors="replace")
    return text


def test_demo_in_a_terminal_serves_until_ctrl_c_and_quarry_works_meanwhile() -> None:
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "scripts.demo"], cwd=REPO_ROOT, stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    try:
        text = _read_until(master, r"keeps serving until Ctrl-C[\s\S]*quarry queryMsgByKey")
        assert "OK: every message was found" in text
        router = re.search(r"NAMESRV_ADDR=(\S+)", text).group(1)  # type: ignore[union-attr]
        listed = run_quarry(router, "clusterList")
        assert listed.returncode == 0 and "broker-a" in listed.stdout and "broker-b" in listed.stdout, listed.stderr
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground group
        assert proc.wait(timeout=60) == 0
        rest = _read_until(master, r"stopping the cluster", timeout_s=10)
        assert "Traceback" not in rest
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        os.close(master)
    gone = run_quarry(router, "clusterList")
    assert gone.returncode == 3  # the router stopped with the demo


def test_demo_without_a_terminal_stops_and_says_so() -> None:
    done = subprocess.run([sys.executable, "-m", "scripts.demo"], cwd=REPO_ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "the cluster stops now" in done.stdout and "keeps serving" not in done.stdout
