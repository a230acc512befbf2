"""quarry-console as a process beside a LocalCluster (the demo and the console's tests).

The launcher's ServiceProcess waits on gRPC health; the console speaks HTTP, so it is waited
for on its /healthz page instead."""
from __future__ import annotations

import os
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from scripts.launcher import free_port


@dataclass
class ConsoleProcess:
    router: str
    log_path: Path
    host: str = "127.0.0.1"
    port: int = 0
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    ca: str = ""  # set when the console serves HTTPS (--tls-cert): the CA that signed its certificate
    proc: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.ca else 'http'}://{self.host}:{self.port}"

    def start(self, wait_s: float = 30.0) -> "ConsoleProcess":
        self.port = self.port or free_port(self.host)
        cmd = [sys.executable, "-m", "quarry.clients.console", "--bind", f"{self.host}:{self.port}", "--router", self.router, *self.args]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, cwd=self.log_path.parent, env={**os.environ, **self.env, "PYTHONUNBUFFERED": "1"},
                                     stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        end = time.monotonic() + wait_s
        pause = threading.Event()
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"quarry-console exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=1, context=ssl.create_default_context(cafile=self.ca) if self.ca else None) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            if time.monotonic() >= end:
                self.stop()
                raise TimeoutError(f"quarry-console at {self.url} not answering in {wait_s}s: {self.log_tail()}")
            pause.wait(0.05)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout_s: float = 10.0) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        return int(self.proc.returncode)
