"""The store checkpoint: a physical offset known to be a record boundary and durable.

Recovery after an unclean shutdown scans from here instead of from the first segment.
Written atomically (temp file, fsync, rename) so a crash leaves the old or the new one.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

FILE_NAME = "quarry-checkpoint.json"


@dataclass
class StoreCheckpoint:
    flushed_offset: int = 0
    timestamp: int = 0
    clean: bool = False  # True when written by a clean shutdown: the log ends exactly here


def load_checkpoint(store_dir: Path) -> StoreCheckpoint | None:
    """The checkpoint, or None when missing or unreadable (then recovery scans everything)."""
    path = store_dir / FILE_NAME
    try:
        data = json.loads(path.read_text())
        return StoreCheckpoint(int(data["flushed_offset"]), int(data["timestamp"]), bool(data.get("clean", False)))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save_checkpoint(store_dir: Path, checkpoint: StoreCheckpoint) -> None:
    path = store_dir / FILE_NAME
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as fh:
        json.dump({"flushed_offset": checkpoint.flushed_offset, "timestamp": checkpoint.timestamp, "clean": checkpoint.clean}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
