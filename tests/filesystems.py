"""A size-limited file system for tests of a full disk: a tmpfs mounted in the test's directory
(the test is skipped where mounting is not allowed)."""
from __future__ import annotations

import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest


@contextmanager
def small_tmpfs(tmp_path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (as mount's size= takes it, e.g. "1m") at tmp_path/small, unmounted after."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a size-limited tmpfs here: {result.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
