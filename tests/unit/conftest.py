"""Fixtures shared by unit test modules."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servicers import InProcessBroker


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[InProcessBroker]:
    """One broker (commitlog and indexer) served in the test process, stopped after the test."""
    b = InProcessBroker("broker-a", tmp_path, ("127.0.0.1", 10911)).start()
    try:
        yield b
    finally:
        b.close()
