"""The indexer checkpoint: the next physical offset to tail from, and the last store time.

Written atomically (temp file, fsync, rename) after the index is flushed, so it never
claims more than the index holds.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from quarry.services.log import log_event

log = logging.getLogger("quarry.indexer.checkpoint")


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
        self.offset, self.timestamp = offset, timestamp
