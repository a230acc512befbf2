"""The source passes pyflakes' checks (ruff's F rules: undefined and unused names, unused
imports) and has no syntax errors: run by `make check` and `make test`. Generated code
(quarry/v1) and installed node_modules are not ours to lint."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ["services", "formats", "clients", "scripts", "pipeline", "bench", "quarry", "tests"]


def test_the_source_passes_pyflakes_checks() -> None:
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent))
    assert ruff, "ruff is not installed in this environment: run `make setup` (requirements-dev.txt pins it)"
    proc = subprocess.run([ruff, "check", "--no-cache", "--select", "E9,F", "--output-format", "concise",
                           "--extend-exclude", "quarry/v1,node_modules", *FOLDERS], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
