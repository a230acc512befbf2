"""Run one broker's indexer service: `python -m services.indexer --help`."""
from __future__ import annotations

import sys

from services.indexer.config import parse_args
from services.indexer.server import serve


def main(argv: list[str] | None = None) -> int:
    return serve(parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    raise SystemExit(main())
