"""gRPC health probe for container health checks: exit 0 when SERVING, 1 otherwise.

`python -m quarry.services.probe --addr 127.0.0.1:9876 [--service NAME] [--timeout 3]`
"""
from __future__ import annotations

import argparse
import sys
import threading
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from quarry.channels import open_channel


def wait_healthy(address: str, deadline_s: float = 20.0, service: str = "") -> None:
    """Wait until the gRPC health service says SERVING, or raise TimeoutError at the deadline.

    `wait_for_ready` makes each call wait for the connection itself, so no sleep is needed
    while the process starts; only a NOT_SERVING answer is re-asked after a short pause.
    """
    end = time.monotonic() + deadline_s
    last: Exception | str = "no answer"
    pause = threading.Event()
    with open_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while (remaining := end - time.monotonic()) > 0:
            try:
                resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=remaining, wait_for_ready=True)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
                last = f"status {resp.status}"
                pause.wait(min(0.05, max(0.0, end - time.monotonic())))
            except grpc.RpcError as exc:
                last = exc
    raise TimeoutError(f"{address} not SERVING after {deadline_s}s: {last}")




def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="quarry-probe", description="Exit 0 when the gRPC health service says SERVING.")
    p.add_argument("--addr", required=True, help="host:port")
    p.add_argument("--service", default="", help="service name ('' = the whole server)")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds")
    args = p.parse_args(argv)
    try:
        wait_healthy(args.addr, deadline_s=args.timeout, service=args.service)
    except TimeoutError as exc:
        print(f"NOT SERVING: {exc}", file=sys.stderr)
        return 1
    print("SERVING")
    return 0


if __name__ == "__main__":
    sys.exit(main())
