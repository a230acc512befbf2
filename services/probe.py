"""gRPC health probe for container health checks, with grpc_health_probe's exit codes:

  0 SERVING, 1 invalid flags, 2 connection failure, 3 RPC failure (e.g. an unknown --service,
  a deadline), 4 unhealthy (the server answered NOT_SERVING or UNKNOWN).

`python -m quarry.services.probe --addr 127.0.0.1:9876 [--service NAME] [--timeout 3]`
retries until --timeout, pausing --retry-interval between attempts (never a busy loop), and
exits with the code of the last attempt, printing one line.
"""
from __future__ import annotations

import argparse
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import NoReturn

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from quarry.channels import open_channel
from quarry.formats.addresses import split_host_port

EXIT_SERVING, EXIT_USAGE, EXIT_CONNECTION, EXIT_RPC, EXIT_UNHEALTHY = 0, 1, 2, 3, 4


@dataclass
class ProbeResult:
    code: int
    message: str


def _connects(address: str, timeout_s: float) -> str:
    """"" when a TCP connection to host:port opens within the timeout, else why not. (A plain
    socket: grpc's connectivity watcher leaves a polling thread behind on a closed channel.)"""
    try:
        host, port = split_host_port(address)
    except ValueError:
        return f"--addr {address!r}: expected host:port"
    try:
        with socket.create_connection((host, port), timeout=max(0.001, timeout_s)):
            return ""
    except OSError as exc:
        return f"failed to connect to {address} within {timeout_s:g}s: {exc.strerror or exc}"


def check_once(channel: grpc.Channel, address: str, service: str, connect_timeout_s: float, rpc_timeout_s: float) -> ProbeResult:
    """One attempt: connect, then one Health.Check."""
    if why := _connects(address, connect_timeout_s):
        return ProbeResult(EXIT_CONNECTION, why)
    try:
        resp = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=max(0.001, rpc_timeout_s), wait_for_ready=True)
    except grpc.RpcError as exc:
        code = exc.code()  # type: ignore[attr-defined]
        if code == grpc.StatusCode.UNIMPLEMENTED:
            return ProbeResult(EXIT_RPC, f"{address} does not implement the gRPC health protocol")
        return ProbeResult(EXIT_RPC, f"health rpc failed: {code.name}: {exc.details()}")  # type: ignore[attr-defined]
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
    if resp.status != health_pb2.HealthCheckResponse.SERVING:
        return ProbeResult(EXIT_UNHEALTHY, f"service unhealthy (responded with {name})")
    return ProbeResult(EXIT_SERVING, f"status: {name}")


def probe(address: str, service: str = "", timeout_s: float = 3.0, connect_timeout_s: float = 1.0, rpc_timeout_s: float = 1.0,
          retry_interval_s: float = 0.25, ready: tuple[int, ...] = (EXIT_SERVING,)) -> ProbeResult:
    """Attempt until a result in `ready` or `timeout_s`; the last attempt's result."""
    end = time.monotonic() + timeout_s
    pause = threading.Event()
    with open_channel(address) as channel:
        while True:
            left = end - time.monotonic()
            result = check_once(channel, address, service, min(connect_timeout_s, left), min(rpc_timeout_s, left))
            if result.code in ready or time.monotonic() + retry_interval_s >= end:
                return result
            pause.wait(retry_interval_s)


def wait_healthy(address: str, deadline_s: float = 20.0, service: str = "", serving_only: bool = True) -> None:
    """Wait until the health service says SERVING (or, `serving_only=False`, answers at all);
    raise TimeoutError at the deadline. Used by the process launcher of tests and demos."""
    ready = (EXIT_SERVING,) if serving_only else (EXIT_SERVING, EXIT_UNHEALTHY)
    result = probe(address, service, deadline_s, connect_timeout_s=deadline_s, rpc_timeout_s=deadline_s, retry_interval_s=0.05, ready=ready)
    if result.code not in ready:
        raise TimeoutError(f"{address} not SERVING after {deadline_s}s: {result.message}")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # grpc_health_probe: 1 for invalid flags
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise ValueError("must be > 0")
    return value


def main(argv: list[str] | None = None) -> int:
    p = _Parser(prog="quarry-probe", description="Ask a server's gRPC health service; exit 0 when SERVING.",
                epilog="exit codes: 0 SERVING, 1 invalid flags, 2 connection failure, 3 RPC failure, 4 unhealthy (NOT_SERVING)")
    p.add_argument("--addr", required=True, help="host:port")
    p.add_argument("--service", default="", help="service name ('' = the whole server)")
    p.add_argument("--timeout", type=_positive, default=3.0, help="seconds to keep retrying before giving up")
    p.add_argument("--connect-timeout", type=_positive, default=1.0, help="seconds one attempt waits for the connection")
    p.add_argument("--rpc-timeout", type=_positive, default=1.0, help="seconds one attempt waits for the answer")
    p.add_argument("--retry-interval", type=_positive, default=0.25, help="seconds between attempts")
    args = p.parse_args(argv)
    result = probe(args.addr, args.service, args.timeout, args.connect_timeout, args.rpc_timeout, args.retry_interval)
    print(result.message, file=sys.stdout if result.code == EXIT_SERVING else sys.stderr)
    return result.code


if __name__ == "__main__":
    sys.exit(main())
