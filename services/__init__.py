"""Quarry's services: commitlog, indexer and query router, and what they share."""

# The folder services/ is installed as quarry.services only: one module, one name.
if __name__ != "quarry.services":
    raise ImportError("import quarry.services, not services: Quarry installs one top-level package, quarry")
