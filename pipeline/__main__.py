"""`python -m quarry.pipeline <job>`: the same as the `quarry-pipeline` console script."""
from quarry.pipeline.cli import main

raise SystemExit(main())
