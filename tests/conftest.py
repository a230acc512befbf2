"""Shared fixtures: where the golden vectors live."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def golden_root() -> Path:
    """The RocketMQ 4.9.8 golden vectors: $QUARRY_GOLDEN, else tests/golden."""
    return Path(os.environ.get("QUARRY_GOLDEN", REPO_ROOT / "tests" / "golden"))


@pytest.fixture(scope="session")
def golden_dir() -> Path:
    root = golden_root()
    if not root.is_dir():
        pytest.fail(f"golden vectors not found at {root} (set QUARRY_GOLDEN)")
    return root
