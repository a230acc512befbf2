"""The store checkpoint: a physical offset known to be a record boundary and durable.

Recovery after an unclean shutdown scans from here instead of from the first segment.
Written atomically and durably (formats/state_file.py): a crash leaves the old or the new one.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from quarry.formats.state_file import read_json, write_json_atomic
from quarry.formats.store_names import STORE_CHECKPOINT as FILE_NAME


@dataclass
class StoreCheckpoint:
    flushed_offset: int = 0
    timestamp: int = 0
    clean: bool = False  # True when written by a clean shutdown: the log ends exactly here


def load_checkpoint(store_dir: Path) -> StoreCheckpoint | None:
    """The checkpoint, or None when missing or unreadable (then recovery scans everything)."""
    path = store_dir / FILE_NAME
    try:
        data = read_json(path)
        return StoreCheckpoint(int(data["flushed_offset"]), int(data["timestamp"]), bool(data.get("clean", False)))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save_checkpoint(store_dir: Path, checkpoint: StoreCheckpoint) -> None:
    # Written on every flush (each SYNC send): no directory fsync. If a power cut loses the
    # rename, the previous checkpoint is an older durable record boundary (or not clean), and
    # recovery scans from there: slower, never wrong.
    write_json_atomic(store_dir / FILE_NAME, {"flushed_offset": checkpoint.flushed_offset, "timestamp": checkpoint.timestamp, "clean": checkpoint.clean},
                      sync_dir=False)
