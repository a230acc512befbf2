"""`python -m quarry.clients …` is the `quarry` CLI."""
from quarry.clients.cli import main

raise SystemExit(main())
