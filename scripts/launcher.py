"""Start Quarry services as real processes and wait until they are healthy.

A testing and demo tool, not part of the installed package: the demo (`make run`), the
benchmarks, the campaigns and the end-to-end tests use it (run from the repository root), so
all of them start services exactly the same way (`python -m quarry.services.<name> --flags`).
"""
from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterator

from quarry.channels import open_channel
from quarry.services.probe import wait_healthy
from quarry.services.settings import address_or_off

MODULES = {"commitlog": "quarry.services.commitlog", "indexer": "quarry.services.indexer", "router": "quarry.services.query"}


_GIVEN: set[tuple[str, int]] = set()  # ports this process handed out (each once)


def _ephemeral_ports() -> tuple[int, int]:
    """The range the kernel picks a port from for bind(0) and outgoing connections."""
    try:
        low, high = (int(n) for n in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free on host a moment ago, outside the kernel's ephemeral range: the
    port is bound only later, by the service, and meanwhile the kernel may hand an ephemeral
    port to anyone binding port 0 (a service's own frames port, say) or connecting out."""
    low, high = _ephemeral_ports()
    first, last = (10000, low - 1) if low > 12000 else (high + 1, 65535)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for _ in range(1000):
        port = random.randint(first, last)
        if (host, port) in _GIVEN:
            continue
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue  # taken (or in TIME_WAIT): another
        _GIVEN.add((host, port))
        return port
    with socket.socket(family, socket.SOCK_STREAM) as s:  # no free port outside the range: any
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class ServiceProcess:
    """One running service process."""

    kind: str
    address: str
    args: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    python: str = sys.executable  # (an A/B bench runs another checkout's interpreter)
    proc: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = None

    @property
    def remoting_address(self) -> str:
        """The RocketMQ 4 remoting address (router: NameServer; commitlog: broker); '' when off."""
        if "--remoting-bind" in self.args:
            return address_or_off(self.args[self.args.index("--remoting-bind") + 1])
        return ""

    def start(self, wait_s: float = 30.0, serving_only: bool = True) -> "ServiceProcess":
        """Start and wait until SERVING (or, `serving_only=False`, until health answers at all:
        an indexer with no commitlog to tail is up but NOT_SERVING)."""
        if self.kind in ("commitlog", "router") and "--remoting-bind" not in self.args:
            # A free port, as for gRPC: the default one would clash between clusters on one host.
            host = self.address.rsplit(":", 1)[0].strip("[]")
            self.args = [*self.args, "--remoting-bind", f"{host}:{free_port(host)}"]
        cmd = [self.python, "-m", MODULES[self.kind], "--bind", self.address, *self.args]
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        # Run beside the log, not in a source tree: the installed package is all a service needs.
        self.proc = subprocess.Popen(cmd, cwd=self.log_path.parent, env=env, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            self._wait(wait_s, serving_only)
        except Exception:
            self.kill()
            raise
        return self

    def _wait(self, wait_s: float, serving_only: bool = True) -> None:
        end = time.monotonic() + wait_s
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                # Short slices so a process that dies while starting is noticed quickly.
                wait_healthy(self.address, deadline_s=min(0.5, max(0.05, end - time.monotonic())), serving_only=serving_only)
                return
            except TimeoutError:
                if time.monotonic() >= end:
                    raise TimeoutError(f"{self.kind} at {self.address} not healthy in {wait_s}s: {self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout_s: float = 15.0) -> int:
        """SIGTERM, wait for a clean exit; SIGKILL if it does not come. Returns the exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._close()
        return int(self.proc.returncode)

    def kill(self) -> None:
        """SIGKILL: a crash, for recovery tests."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._close()

    def _close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


def _flag(args: list[str], flag: str) -> str:
    """The value of `flag`'s last occurrence in `args` (as argparse reads it), "" when absent."""
    at = [i for i, a in enumerate(args) if a == flag and i + 1 < len(args)]
    return args[at[-1] + 1] if at else ""


@dataclass
class BrokerProcesses:
    """One broker: its commitlog and indexer processes."""

    name: str
    host: str
    commitlog: ServiceProcess
    indexer: ServiceProcess
    store_dir: Path
    index_dir: Path


@dataclass
class LocalCluster:
    """A router and brokers on loopback, each broker on its own 127.0.0.x address.

    Distinct addresses make offsetMsgIds differ between brokers, as on real hosts.
    """

    root: Path
    router: ServiceProcess | None = None
    brokers: dict[str, BrokerProcesses] = field(default_factory=dict)
    commitlog_args: list[str] = field(default_factory=list)
    indexer_args: list[str] = field(default_factory=list)
    heartbeat_ms: int = 500
    env: dict[str, str] = field(default_factory=dict)  # extra environment of every process (TLS, ACL)
    # Each indexer reads key queries' records from its commitlog's files (same host) instead
    # of calling the commitlog (indexer --commitlog-store-dir).
    indexer_reads_store: bool = False
    # Each commitlog answers RocketMQ 4 key queries from its indexer's IndexFiles, mapped
    # read-only (commitlog --index-dir and the indexer's geometry), instead of asking it.
    commitlog_reads_index: bool = True
    python: str = sys.executable  # the interpreter of every process (its checkout's .venv)

    def start_router(self, *args: str, host: str = "127.0.0.1") -> ServiceProcess:
        self.router = ServiceProcess(
            "router", f"{host}:{free_port(host)}",
            ["--heartbeat-interval-ms", str(self.heartbeat_ms), *args], self.root / "logs" / "router.log", env=dict(self.env), python=self.python,
        ).start()
        return self.router

    def add_broker(self, name: str, host: str, commitlog_args: list[str] | None = None, indexer_args: list[str] | None = None) -> BrokerProcesses:
        assert self.router is not None, "start the router first"
        store_dir, index_dir = self.root / name / "store", self.root / name / "index"
        cl_addr, ix_addr = f"{host}:{free_port(host)}", f"{host}:{free_port(host)}"
        ix_args = ["--index-dir", str(index_dir), *self.indexer_args, *(indexer_args or [])]
        reads_index: list[str] = []
        if self.commitlog_reads_index:
            # The directory the indexer will use, made now: the commitlog starts first and maps what appears there.
            Path(_flag(ix_args, "--index-dir")).mkdir(parents=True, exist_ok=True)
            reads_index = ["--index-dir", _flag(ix_args, "--index-dir")]
            for ours, theirs in (("--index-hash-slots", "--hash-slots"), ("--index-num", "--index-num"), ("--index-max-num", "--max-msgs-num-batch")):
                if _flag(ix_args, theirs):
                    reads_index += [ours, _flag(ix_args, theirs)]
        commitlog = ServiceProcess(
            "commitlog", cl_addr,
            ["--store-dir", str(store_dir), "--broker-name", name, "--router", self.router.address, "--indexer-addr", ix_addr,
             "--heartbeat-interval-ms", str(self.heartbeat_ms), *reads_index, *self.commitlog_args, *(commitlog_args or [])],
            self.root / "logs" / f"{name}-commitlog.log", env=dict(self.env), python=self.python,
        ).start()
        indexer = ServiceProcess(
            "indexer", ix_addr,
            ["--index-dir", str(index_dir), "--commitlog", cl_addr, "--broker-name", name,
             *(["--commitlog-store-dir", str(store_dir)] if self.indexer_reads_store else []), *self.indexer_args, *(indexer_args or [])],
            self.root / "logs" / f"{name}-indexer.log", env=dict(self.env), python=self.python,
        ).start()
        broker = BrokerProcesses(name, host, commitlog, indexer, store_dir, index_dir)
        self.brokers[name] = broker
        return broker

    def wait_indexed(self, timeout_s: float = 120.0) -> None:
        """Wait until every broker's indexer has tailed its commitlog to the current end."""
        from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, indexer_pb2, indexer_pb2_grpc

        pause = threading.Event()
        for b in self.brokers.values():
            with open_channel(b.commitlog.address) as cch, open_channel(b.indexer.address) as ich:
                end = commitlog_pb2_grpc.CommitLogServiceStub(cch).GetStoreStatus(commitlog_pb2.GetStoreStatusRequest(), timeout=10).max_offset
                stub = indexer_pb2_grpc.IndexerServiceStub(ich)
                deadline = time.monotonic() + timeout_s
                while stub.GetIndexStatus(indexer_pb2.GetIndexStatusRequest(), timeout=10).checkpoint_offset < end:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{b.name}: index did not reach {end} within {timeout_s}s")
                    pause.wait(0.1)

    @contextmanager
    def running(self, brokers: dict[str, str], *router_args: str, router_host: str = "127.0.0.1") -> Iterator["LocalCluster"]:
        """The router, then each broker (name: its 127.0.0.x host); everything stopped on exit."""
        try:
            self.start_router(*router_args, host=router_host)
            for name, host in brokers.items():
                self.add_broker(name, host)
            yield self
        finally:
            self.stop()

    def stop(self) -> None:
        for broker in reversed(list(self.brokers.values())):
            broker.indexer.stop()
            broker.commitlog.stop()
        if self.router is not None:
            self.router.stop()
