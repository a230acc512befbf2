"""Consumer offsets of one broker: group → topic → queue → next offset to consume.

Kept in the store's config/consumerOffset.json in RocketMQ's own layout
({"offsetTable": {"topic@group": {"0": 12}}}), replaced atomically. Updates are cheap
(memory); `persist` writes when something changed and runs on an interval and at stop, so
a crash loses at most one interval of commits (RocketMQ's broker persists every 5 s).
Any consumer path (RocketMQ 4 remoting, RocketMQ 5 consumer groups) reads and commits here.
"""
from __future__ import annotations

import threading
from pathlib import Path

from quarry.formats.state_file import read_json, write_json_atomic

FILE_NAME = "consumerOffset.json"


class ConsumerOffsets:
    def __init__(self, config_dir: Path, read_only: bool = False, load: bool = True) -> None:
        self.path = Path(config_dir) / FILE_NAME
        self.read_only = read_only or not load
        self._lock = threading.Lock()
        self._table: dict[tuple[str, str], dict[int, int]] = {}  # (topic, group) -> queue -> offset
        self._dirty = False
        self.version = 0  # changes made, counted (what the persister's progress is measured in)
        self.persisted = 0  # the version the file holds
        if load and self.path.exists():
            try:
                data = read_json(self.path)
                for key, queues in (data.get("offsetTable") or {}).items():
                    topic, sep, group = str(key).rpartition("@")
                    if sep and isinstance(queues, dict):
                        self._table[(topic, group)] = {int(q): int(o) for q, o in queues.items()}
            except (ValueError, AttributeError, TypeError) as exc:
                # Refuse to start rather than serve (and later overwrite) offsets it cannot read.
                raise ValueError(f"{self.path}: not a consumer offset table ({exc}); fix or move it away") from None

    def get(self, group: str, topic: str, queue_id: int) -> int | None:
        with self._lock:
            return self._table.get((topic, group), {}).get(queue_id)

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        if offset < 0:
            raise ValueError(f"commitOffset: must be >= 0, got {offset}")
        with self._lock:
            queues = self._table.setdefault((topic, group), {})
            if queues.get(queue_id) != offset:
                queues[queue_id] = offset
                self._dirty = True
                self.version += 1

    def entries(self) -> list[tuple[str, str, int, int]]:
        """Every (topic, group, queue, offset) held."""
        with self._lock:
            return [(t, g, q, o) for (t, g), qs in self._table.items() for q, o in qs.items()]

    def groups(self, topic: str) -> dict[str, dict[int, int]]:
        with self._lock:
            return {g: dict(q) for (t, g), q in self._table.items() if t == topic}

    def persist(self) -> bool:
        """Write the table if it changed; returns whether it wrote."""
        if self.read_only:
            return False
        with self._lock:
            if not self._dirty:
                return False
            table = {f"{t}@{g}": {str(q): o for q, o in sorted(qs.items())} for (t, g), qs in sorted(self._table.items())}
            self._dirty = False
            version = self.version
        try:
            write_json_atomic(self.path, {"offsetTable": table}, indent=1)
        except OSError:
            with self._lock:
                self._dirty = True
            raise
        self.persisted = max(self.persisted, version)
        return True
