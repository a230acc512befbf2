"""Benchmark plumbing: a result row, the JSON file per benchmark, and the README table.

A benchmark is a module `bench/<name>.py` with `run(argv: list[str]) -> list[Result]`.
`python -m bench <name> [args]` runs it, writes `bench/results/<name>.json` and replaces
that benchmark's rows in the table of `bench/README.md`.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
README = BENCH_DIR / "README.md"
REPO_DIR = BENCH_DIR.parent
TREES_DIR = BENCH_DIR / ".trees"  # git-ignored: checkouts of other revisions for A/B benches
TABLE_BEGIN = "<!-- results:begin -->"
TABLE_END = "<!-- results:end -->"


@dataclass
class Result:
    """One measured figure."""

    metric: str
    value: float
    unit: str
    params: dict[str, Any] = field(default_factory=dict)
    command: str = ""
    date: str = ""


def source_tree(spec: str) -> Path:
    """A source tree for an A/B bench: a directory (a checkout with its own `make setup` done),
    or `git:<revision>`, checked out once into bench/.trees/<short sha> and set up there, so a
    bench command never names a folder outside the repository."""
    if not spec.startswith("git:"):
        tree = Path(spec).resolve()
        if not (tree / ".venv" / "bin" / "python").exists():
            raise SystemExit(f"source tree {spec!r}: no .venv/bin/python (run `make setup` there, or pass git:<revision>)")
        return tree
    rev = spec[len("git:"):]
    cp = subprocess.run(["git", "-C", str(REPO_DIR), "rev-parse", "--short", "--verify", "--quiet", f"{rev}^{{commit}}"],
                        capture_output=True, text=True)
    if cp.returncode != 0:
        raise SystemExit(f"source tree {spec!r}: {rev!r} is not a commit of this repository")
    dest = TREES_DIR / cp.stdout.strip()  # named by sha, so `X^` and `X~1` share one checkout
    if not dest.exists():
        subprocess.run(["git", "-C", str(REPO_DIR), "worktree", "add", "--detach", str(dest), cp.stdout.strip()], check=True)
    if not (dest / ".venv" / "bin" / "python").exists():
        subprocess.run(["make", "setup"], cwd=dest, check=True)
    return dest


def tree_python(tree: Path) -> str:
    """The interpreter of a source tree returned by source_tree."""
    return str(tree / ".venv" / "bin" / "python")


def wait_for_commitlog(proc: subprocess.Popen[bytes], address: str, log_path: Path, timeout_s: float = 60.0) -> None:
    """Block until the commitlog process at `address` answers; kill it and raise (with the end of
    its log) if it exits or does not answer in time."""
    import grpc

    from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with grpc.insecure_channel(address) as ch:
                commitlog_pb2_grpc.CommitLogServiceStub(ch).GetStoreStatus(commitlog_pb2.GetStoreStatusRequest(), timeout=1)
            return
        except grpc.RpcError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError(f"commitlog at {address} did not start: {log_path.read_text()[-2000:]}") from None
            time.sleep(0.1)


def command_line(name: str, argv: list[str]) -> str:
    return shlex.join([".venv/bin/python", "-m", "bench", name, *argv])


def write_results(name: str, argv: list[str], results: list[Result]) -> Path:
    """Stamp command and date, write the JSON file and the README rows; return the JSON path."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    cmd = command_line(name, argv)
    for r in results:
        r.command = r.command or cmd
        r.date = r.date or now
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    _update_table(name, results)
    return path


def _row(name: str, r: Result) -> str:
    params = ", ".join(f"{k}={v}" for k, v in sorted(r.params.items()))
    value = f"{r.value:,.0f}" if abs(r.value) >= 100 else f"{r.value:,.3g}"
    return f"| {name} | {r.metric} | {value} | {r.unit} | {params} | `{r.command}` | {r.date[:10]} |"


def _update_table(name: str, results: list[Result]) -> None:
    text = README.read_text() if README.exists() else f"# Benchmarks\n\n{TABLE_BEGIN}\n{TABLE_END}\n"
    if TABLE_BEGIN not in text:
        text += f"\n{TABLE_BEGIN}\n{TABLE_END}\n"
    head, rest = text.split(TABLE_BEGIN, 1)
    table, tail = rest.split(TABLE_END, 1)
    header = ["| benchmark | metric | value | unit | params | command | date |", "|---|---|---|---|---|---|---|"]
    rows = [ln for ln in table.strip().splitlines() if ln.startswith("|") and ln not in header]
    rows = [ln for ln in rows if not ln.startswith(f"| {name} |")]
    rows += [_row(name, r) for r in results]
    rows.sort(key=lambda ln: ln.split("|")[1].strip())
    README.write_text(head + TABLE_BEGIN + "\n" + "\n".join(header + rows) + "\n" + TABLE_END + tail)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        names = sorted(p.stem for p in BENCH_DIR.glob("*.py") if p.stem not in ("__init__", "__main__", "runner"))
        print("usage: python -m bench <name> [args]\nbenchmarks: " + ", ".join(names))
        return 0
    import importlib

    name, rest = args[0], args[1:]
    module = importlib.import_module(f"bench.{name}")
    results: list[Result] = module.run(rest)
    path = write_results(name, rest, results)
    for r in results:
        print(f"{r.metric:40s} {r.value:14,.2f} {r.unit:8s} {r.params}")
    print(f"wrote {path} and {README}")
    return 0


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used, from /proc: where a load's time went,
    and a figure other load on the machine disturbs far less than a rate."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
