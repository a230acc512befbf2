"""`python -m pipeline <job>`: the same as the `quarry-pipeline` console script."""
from pipeline.cli import main

raise SystemExit(main())
