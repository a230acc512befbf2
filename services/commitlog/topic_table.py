"""Topics and their queue counts, persisted as JSON (atomically) in the store's config/."""
from __future__ import annotations

import json
import os
from pathlib import Path

FILE_NAME = "quarry-topics.json"


def load_topics(config_dir: Path) -> dict[str, int]:
    path = config_dir / FILE_NAME
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    return {str(t): int(n) for t, n in data.get("topics", {}).items()}


def save_topics(config_dir: Path, topics: dict[str, int]) -> None:
    config_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = config_dir / FILE_NAME
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as fh:
        json.dump({"topics": dict(sorted(topics.items()))}, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
