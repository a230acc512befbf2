"""PySpark jobs over CommitLog stores: `reindex`, `export`, `lookup` (see docs/pipeline.md).

Format code is imported from `formats/` and the IndexFile list from
`services/indexer/index_store.py`; nothing here re-implements a RocketMQ format.
"""

# The folder pipeline/ is installed as quarry.pipeline only: one module, one name.
if __name__ != "quarry.pipeline":
    raise ImportError("import quarry.pipeline, not pipeline: Quarry installs one top-level package, quarry")
