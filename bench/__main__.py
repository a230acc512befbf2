"""`python -m bench <name> [args]`: run one benchmark and record its figures."""
from bench.runner import main

raise SystemExit(main())
