"""Run the console: `quarry-console --bind 127.0.0.1:8080 --router 127.0.0.1:9876` (`--help`)."""
from __future__ import annotations

import sys

from quarry.clients.console.config import parse_args
from quarry.clients.console.server import serve


def main(argv: list[str] | None = None) -> int:
    return serve(parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    raise SystemExit(main())
