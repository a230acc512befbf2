"""PySpark jobs over CommitLog stores: `reindex`, `export`, `lookup` (see docs/pipeline.md).

Format code is imported from `formats/` and the IndexFile list from
`services/indexer/index_store.py`; nothing here re-implements a RocketMQ format.
"""
