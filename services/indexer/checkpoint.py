"""The indexer checkpoint: the next physical offset to tail from, and the last store time.

Written atomically (temp file, fsync, rename) after the index is flushed, so it never
claims more than the index holds.

Its file is `quarry-index-checkpoint.json`. Quarry once named it `checkpoint`, which is also
the name of RocketMQ's store-root checkpoint: an indexer pointed at a RocketMQ store root
replaced RocketMQ's file. `open_checkpoint` migrates a `checkpoint` Quarry wrote and refuses
to write into a directory holding one it did not (Quarry never overwrites a file it did not
create).
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from quarry.services.log import log_event

log = logging.getLogger("quarry.indexer.checkpoint")

FILE_NAME = "quarry-index-checkpoint.json"
LEGACY_NAME = "checkpoint"  # Quarry's old name, and RocketMQ's store-root checkpoint


class ForeignStoreError(Exception):
    """The index directory holds files Quarry did not create; writing there could destroy them."""


def _is_quarry_checkpoint(path: Path) -> bool:
    """True for a file holding what IndexCheckpoint.save writes (RocketMQ's is a binary page)."""
    try:
        if path.stat().st_size > 4096:
            return False
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and isinstance(data.get("next_offset"), int) and isinstance(data.get("timestamp"), int)


def foreign_files(index_dir: Path) -> list[str]:
    """What in `index_dir` shows it is not an indexer's directory (e.g. a RocketMQ store root)."""
    found = []
    legacy = index_dir / LEGACY_NAME
    if legacy.is_file() and not _is_quarry_checkpoint(legacy):
        found.append(f"{legacy} (not a Quarry checkpoint: RocketMQ's store checkpoint has this name)")
    if (index_dir / "commitlog").is_dir() and not (index_dir / "quarry-checkpoint.json").exists():
        found.append(f"{index_dir / 'commitlog'} (a RocketMQ store's CommitLog)")
    return found


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_checkpoint(index_dir: Path, read_only: bool = False) -> "IndexCheckpoint":
    """The indexer's checkpoint in `index_dir`, migrating Quarry's old `checkpoint` file.

    Writable: refuses (ForeignStoreError) a directory holding files Quarry did not create, and
    moves an old Quarry `checkpoint` to the new name (new file written and synced before the
    old one is removed, so a crash between leaves a readable checkpoint). Read-only: reads
    whichever Quarry checkpoint is there and writes nothing.
    """
    path, legacy = index_dir / FILE_NAME, index_dir / LEGACY_NAME
    foreign = foreign_files(index_dir)
    if foreign and not read_only:
        raise ForeignStoreError(
            f"--index-dir {index_dir} holds files Quarry did not create: {'; '.join(foreign)}. Quarry never writes "
            "there: give the indexer a directory of its own, or serve those IndexFiles with --read-only true"
        )
    ours_legacy = legacy.is_file() and _is_quarry_checkpoint(legacy)
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
    _fsync_dir(index_dir)
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
                data = json.loads(path.read_text())
                self.offset = int(data["next_offset"])
                self.timestamp = int(data["timestamp"])
                if self.offset < 0:
                    raise ValueError("negative offset")
            except (OSError, ValueError, KeyError, TypeError) as exc:
                self.offset, self.timestamp = 0, 0
                self.problem = f"checkpoint {path} unreadable ({exc}); re-indexing from the start of the log"
                log_event(log, "checkpoint unreadable", logging.WARNING, path=str(path), error=str(exc))

    def save(self, offset: int, timestamp: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as fh:
            json.dump({"next_offset": offset, "timestamp": timestamp}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        _fsync_dir(self.path.parent)  # the rename itself survives a power cut
        self.offset, self.timestamp = offset, timestamp
