"""`python -m clients …` is the `quarry` CLI."""
from clients.cli import main

raise SystemExit(main())
