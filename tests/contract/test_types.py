"""The source passes mypy with pyproject's [tool.mypy] settings (strict for formats/ and the
storage layer): run by `make check`, `make lint` and `make test`."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_package_passes_mypy() -> None:
    mypy = shutil.which("mypy", path=str(Path(sys.executable).parent))
    assert mypy, "mypy is not installed in this environment: run `make setup` (requirements-dev.txt pins it)"
    proc = subprocess.run([mypy, "--no-error-summary"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
