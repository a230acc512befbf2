"""Health probe of quarry-console for container health checks (the services' probe speaks
gRPC health; the console speaks HTTP): GET http://<addr>/healthz.

  0 serving, 1 invalid flags, 2 connection failure, 4 unhealthy (any answer but 200)

`python -m quarry.clients.console.probe --addr 127.0.0.1:8080 [--timeout 3]` (in the image:
`python -m quarry.entrypoint console-probe --addr …`); prints one line.
"""
from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request

from quarry.formats.addresses import parse_host_port

EXIT_SERVING, EXIT_USAGE, EXIT_CONNECTION, EXIT_UNHEALTHY = 0, 1, 2, 4


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="console-probe", description="quarry-console health probe: GET /healthz")
    p.add_argument("--addr", required=True, help="host:port of the console")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds")
    try:
        args = p.parse_args(sys.argv[1:] if argv is None else argv)
        addr = parse_host_port(args.addr, "--addr")
    except SystemExit:
        return EXIT_USAGE
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    try:
        with urllib.request.urlopen(f"http://{addr}/healthz", timeout=args.timeout) as r:
            status = r.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except OSError as exc:
        print(f"console at {addr}: no connection ({exc})")
        return EXIT_CONNECTION
    print(f"console at {addr}: {'serving' if status == 200 else f'HTTP {status}'}")
    return EXIT_SERVING if status == 200 else EXIT_UNHEALTHY


if __name__ == "__main__":
    raise SystemExit(main())
