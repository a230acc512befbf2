"""The first page of a topic browse over a 1-minute window of a 1,000,000-message store: time to
its first row in the browser (quarry-console in Debian's Chromium, headless, driven by the
tests' playwright-core driver, tests/console/drive.mjs) beside the same query on the CLI
(`quarry printMsg`, time from starting the process to its first message line), in the same
run against the same router and broker; and the router's own answer time (AdminClient in this
process) to show what each adds.

The store is built as bench/browse.py builds it (the append module in batches of 1,000, 100
messages per second of store time), so the window holds 6,000 messages; every query asks for
the newest 50 of it (the console's page size).

`.venv/bin/python -m bench console [--messages 1000000] [--repeat 15]`
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.browse import TOPIC, build, window
from bench.runner import REPO_DIR, Result
from quarry.clients.admin import AdminClient
from scripts.console_process import ConsoleProcess
from scripts.launcher import ServiceProcess, free_port

PAGE = 50
DRIVER = REPO_DIR / "tests" / "console" / "drive.mjs"
PLAYWRIGHT = REPO_DIR / "tests" / "console" / "node_modules" / "playwright-core" / "package.json"
CHROMIUM = os.environ.get("QUARRY_CHROMIUM", "/usr/bin/chromium")
ROW = "#browse-table tbody tr.msg-row"


def _tools() -> None:
    if shutil.which("node") is None:
        raise SystemExit("bench console: node (Node.js) not found: the browser is driven by Playwright from node")
    if not PLAYWRIGHT.exists():
        raise SystemExit(f"bench console: playwright-core not installed at {PLAYWRIGHT.parent}: run `make console-browser`")
    if not os.access(CHROMIUM, os.X_OK):
        raise SystemExit(f"bench console: {CHROMIUM} not found: run `make console-browser`")


def _browser_ms(console: ConsoleProcess, path: str, repeat: int) -> list[float]:
    """Each load of the view until its first row, one warm-up load first (not counted)."""
    scenario = {"base": console.url, "shots": "", "steps": [{"do": "firstRow", "path": path, "selector": ROW, "repeat": repeat + 1}]}
    done = subprocess.run(["node", str(DRIVER), json.dumps(scenario)], capture_output=True, text=True, timeout=600, cwd=DRIVER.parent)
    if done.returncode != 0:
        raise RuntimeError(f"drive.mjs failed: {done.stderr[-3000:]}\nconsole log: {console.log_tail(20)}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    (step,) = out["results"]
    assert not out["errors"] and step["rows"] == PAGE, out
    return [float(ms) for ms in step["times"][1:]]


def _cli_ms(router: str, begin: int, end: int, repeat: int) -> list[float]:
    """`quarry printMsg` from process start to its first message line on stdout."""
    cmd = [str(Path(sys.executable).parent / "quarry"), "-n", router, "printMsg", "-t", TOPIC, "-b", str(begin), "-e", str(end),
           "--max", str(PAGE), "--page-size", str(PAGE), "-d", "false"]
    times = []
    for i in range(repeat + 1):
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        first = proc.stdout.readline()
        elapsed = time.perf_counter() - t0
        rest = proc.stdout.read()
        proc.wait(60)
        assert first.startswith("MSGID") and proc.returncode == 0, (first, proc.stderr.read() if proc.stderr else "")
        assert sum(1 for line in (first + rest).splitlines() if line.startswith("MSGID")) == PAGE
        if i:
            times.append(elapsed * 1000)
    return times


def _router_ms(admin: AdminClient, begin: int, end: int, repeat: int) -> list[float]:
    times = []
    for i in range(repeat + 1):
        t0 = time.perf_counter()
        r = admin.browse_topic(TOPIC, begin, end, max_num=PAGE)
        elapsed = time.perf_counter() - t0
        assert r.complete and len(r.messages) == PAGE
        if i:
            times.append(elapsed * 1000)
    return times


def _p(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def run(argv: list[str]) -> list[Result]:
    p = argparse.ArgumentParser(prog="bench console")
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=15)
    args = p.parse_args(argv)
    _tools()
    root = Path(tempfile.mkdtemp(prefix="quarry-bench-console-"))
    try:
        store_dir = root / "store"
        t0 = time.perf_counter()
        build(store_dir, args.messages)
        built_s = time.perf_counter() - t0
        begin, end = window(args.messages)
        router = ServiceProcess("router", f"127.0.0.1:{free_port()}", ["--heartbeat-interval-ms", "500"], root / "logs" / "router.log").start()
        addr = f"127.0.0.31:{free_port('127.0.0.31')}"
        commitlog = ServiceProcess("commitlog", addr, ["--store-dir", str(store_dir), "--broker-name", "broker-a", "--router", router.address,
                                                       "--heartbeat-interval-ms", "500", "--segment-size", str(256 << 20)], root / "logs" / "commitlog.log")
        console = None
        try:
            commitlog.start(wait_s=300)  # a 1M-message store is opened and checked before it serves
            with AdminClient(router.address) as admin:
                deadline = time.monotonic() + 30
                while TOPIC not in admin.topics() and time.monotonic() < deadline:
                    time.sleep(0.05)  # bench setup, not a test: the broker's first heartbeat
                token, in_window = "", 0
                while True:  # the window's size, read once
                    page = admin.browse_topic(TOPIC, begin, end, max_num=1024, continuation_token=token)
                    in_window += len(page.messages)
                    token = page.next_token
                    if not token:
                        break
                console = ConsoleProcess(router.address, root / "logs" / "console.log").start()
                path = f"/browse?topic={TOPIC}&begin={begin}&end={end}&order=newest&pageSize={PAGE}"
                # interleaved rounds, so a noisy moment of the shared machine falls on all three
                browser, cli, direct = [], [], []
                rounds = 3
                for _ in range(rounds):
                    n = max(1, args.repeat // rounds)
                    browser += _browser_ms(console, path, n)
                    cli += _cli_ms(router.address, begin, end, n)
                    direct += _router_ms(admin, begin, end, n)
        finally:
            if console is not None:
                console.stop()
            commitlog.stop()
            router.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    params = {"store_messages": args.messages, "window": "1 min", "window_messages": in_window,
              "page": PAGE, "order": "newest first", "samples": len(browser)}
    b50, c50, r50 = statistics.median(browser), statistics.median(cli), statistics.median(direct)
    return [
        Result("store built (append module, batches of 1000)", args.messages / built_s, "msg/s", {"store_messages": args.messages}),
        Result("browser: time to first row, p50 (navigation to first table row)", b50, "ms", params),
        Result("browser: time to first row, p90", _p(browser, 0.9), "ms", params),
        Result("CLI printMsg: time to first row, p50 (process start to first line)", c50, "ms", params),
        Result("CLI printMsg: time to first row, p90", _p(cli, 0.9), "ms", params),
        Result("router answer, p50 (AdminClient in process)", r50, "ms", params),
        Result("browser / CLI time to first row (p50)", b50 / c50, "x", {"store_messages": args.messages}),
    ]
