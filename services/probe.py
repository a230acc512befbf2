"""gRPC health probe for container health checks: exit 0 when SERVING, 1 otherwise.

`python -m quarry.services.probe --addr 127.0.0.1:9876 [--service NAME] [--timeout 3]`
"""
from __future__ import annotations

import argparse
import sys

from quarry.services.launcher import wait_healthy


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
