"""Topics and their queue counts, persisted as JSON (atomically) in the store's config/."""
from __future__ import annotations

from pathlib import Path

from quarry.formats.state_file import read_json, write_json_atomic

FILE_NAME = "quarry-topics.json"


def load_topics(config_dir: Path) -> dict[str, int]:
    path = config_dir / FILE_NAME
    if not path.exists():
        return {}
    data = read_json(path)
    return {str(t): int(n) for t, n in data.get("topics", {}).items()}


def save_topics(config_dir: Path, topics: dict[str, int]) -> None:
    write_json_atomic(config_dir / FILE_NAME, {"topics": dict(sorted(topics.items()))}, indent=1)
