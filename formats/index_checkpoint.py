"""The indexer's checkpoint file: the next physical offset to tail from and the last store time.

Written by the streaming indexer after each index flush and by the pipeline's reindex (so an
indexer can start where a reindex ended); read by the indexer at start. Its file is
`quarry-index-checkpoint.json`; Quarry once named it `checkpoint`, which is also the name of
RocketMQ's store-root checkpoint, so a directory holding a `checkpoint` Quarry did not write
(or a RocketMQ CommitLog) is not an index directory (`foreign_files`).
"""
from __future__ import annotations

import json
from pathlib import Path

from quarry.formats.dir_lock import lock_dir
from quarry.formats.state_file import read_json, write_json_atomic
from quarry.formats.store_names import STORE_CHECKPOINT

FILE_NAME = "quarry-index-checkpoint.json"
LOCK_NAME = "quarry-index.lock"  # formats/dir_lock.py
LEGACY_NAME = "checkpoint"  # Quarry's old name, and RocketMQ's store-root checkpoint


def save_index_checkpoint(path: Path, next_offset: int, timestamp: int) -> None:
    write_json_atomic(path, {"next_offset": next_offset, "timestamp": timestamp})


def load_index_checkpoint(path: Path) -> tuple[int, int]:
    """(next offset, timestamp); OSError / ValueError / KeyError / TypeError when unreadable."""
    data = read_json(path)
    offset, timestamp = int(data["next_offset"]), int(data["timestamp"])
    if offset < 0:
        raise ValueError("negative offset")
    return offset, timestamp


def is_quarry_checkpoint(path: Path) -> bool:
    """True for a file holding what save_index_checkpoint writes (RocketMQ's is a binary page)."""
    try:
        if path.stat().st_size > 4096:
            return False
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and isinstance(data.get("next_offset"), int) and isinstance(data.get("timestamp"), int)


def lock_index_dir(index_dir: Path, flag: str) -> int:
    """One writer per index directory (an indexer, or the pipeline's reindex): its
    `quarry-index.lock` (formats/dir_lock.py), held while the returned descriptor is open.
    Not the store's `lock`: an indexer may keep its index in its commitlog's directory."""
    return lock_dir(index_dir, flag, "a Quarry indexer or reindex job",
                    "one writer per index directory: give each its own, or serve these IndexFiles beside it with --read-only true",
                    name=LOCK_NAME)


def rocketmq_store_checkpoint(directory: Path) -> Path | None:
    """The RocketMQ broker's store checkpoint in `directory` (a binary `checkpoint` at a store
    root, which Quarry never writes: its own are JSON), or None."""
    path = directory / LEGACY_NAME
    return path if path.is_file() and not is_quarry_checkpoint(path) else None


def foreign_files(index_dir: Path) -> list[str]:
    """What in `index_dir` shows it is not an indexer's directory (e.g. a RocketMQ store root)."""
    found = []
    legacy = rocketmq_store_checkpoint(index_dir)
    if legacy is not None:
        found.append(f"{legacy} (not a Quarry checkpoint: RocketMQ's store checkpoint has this name)")
    if (index_dir / "commitlog").is_dir() and not (index_dir / STORE_CHECKPOINT).exists():
        found.append(f"{index_dir / 'commitlog'} (a RocketMQ store's CommitLog)")
    return found
