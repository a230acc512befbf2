"""Run one broker's indexer service: `python -m quarry.services.indexer --help`."""
from __future__ import annotations

import sys

from quarry.services.indexer.config import parse_args
from quarry.services.indexer.main import serve


def main(argv: list[str] | None = None) -> int:
    return serve(parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    raise SystemExit(main())
