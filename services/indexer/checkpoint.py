"""The indexer checkpoint: the next physical offset to tail from, and the last store time.

Written atomically (formats/index_checkpoint.py) after the index is flushed, so it never
claims more than the index holds.

Its file is `quarry-index-checkpoint.json`. Quarry once named it `checkpoint`, which is also
the name of RocketMQ's store-root checkpoint: an indexer pointed at a RocketMQ store root
replaced RocketMQ's file (the file's rules are in formats/index_checkpoint.py). `open_checkpoint` migrates a `checkpoint` Quarry wrote and refuses
to write into a directory holding one it did not (Quarry never overwrites a file it did not
create).
"""
from __future__ import annotations

import logging
from pathlib import Path

from quarry.formats.index_checkpoint import (
    FILE_NAME, LEGACY_NAME, foreign_files, is_quarry_checkpoint, load_index_checkpoint, save_index_checkpoint,
)
from quarry.formats.state_file import fsync_dir

from quarry.services.log import log_event

log = logging.getLogger("quarry.indexer.checkpoint")

class ForeignStoreError(Exception):
    """The index directory holds files Quarry did not create; writing there could destroy them."""


def refuse_foreign(index_dir: Path) -> None:
    """ForeignStoreError when `index_dir` holds files Quarry did not create (a writer's check,
    made before anything is written there, the lock included)."""
    foreign = foreign_files(index_dir)
    if foreign:
        raise ForeignStoreError(
            f"--index-dir {index_dir} holds files Quarry did not create: {'; '.join(foreign)}. Quarry never writes "
            "there: give the indexer a directory of its own, or serve those IndexFiles with --read-only true"
        )


def open_checkpoint(index_dir: Path, read_only: bool = False) -> "IndexCheckpoint":
    """The indexer's checkpoint in `index_dir`, migrating Quarry's old `checkpoint` file.

    Writable: refuses (ForeignStoreError) a directory holding files Quarry did not create, and
    moves an old Quarry `checkpoint` to the new name (new file written and synced before the
    old one is removed, so a crash between leaves a readable checkpoint). Read-only: reads
    whichever Quarry checkpoint is there and writes nothing.
    """
    path, legacy = index_dir / FILE_NAME, index_dir / LEGACY_NAME
    if not read_only:
        refuse_foreign(index_dir)
    ours_legacy = legacy.is_file() and is_quarry_checkpoint(legacy)
    if not ours_legacy:
        return IndexCheckpoint(path)
    if read_only:
        return IndexCheckpoint(path if path.exists() else legacy)
    if not path.exists():
        old = IndexCheckpoint(legacy)
        migrated = IndexCheckpoint(path)
        migrated.save(old.offset, old.timestamp)
        log_event(log, "checkpoint migrated", old=str(legacy), new=str(path), next_offset=old.offset)
    legacy.unlink()  # ours (checked above) and superseded by the synced new file
    fsync_dir(index_dir)
    return IndexCheckpoint(path)


class IndexCheckpoint:
    """Load at start, save after each index flush."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.timestamp = 0
        self.problem = ""
        if path.exists():
            try:
                self.offset, self.timestamp = load_index_checkpoint(path)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                self.offset, self.timestamp = 0, 0
                self.problem = f"checkpoint {path} unreadable ({exc}); re-indexing from the start of the log"
                log_event(log, "checkpoint unreadable", logging.WARNING, path=str(path), error=str(exc))

    def save(self, offset: int, timestamp: int) -> None:
        save_index_checkpoint(self.path, offset, timestamp)  # atomic, the directory synced too
        self.offset, self.timestamp = offset, timestamp
