"""One indexer writes an --index-dir (its `quarry-index.lock`, formats/dir_lock.py): a second writable indexer on the
same directory refuses to start with one line that says why, the first goes on, a read-only
indexer still opens beside it, and once the first has stopped the directory opens again."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from scripts.launcher import MODULES, free_port
from tests.e2e.conftest import Launch

_NO_COMMITLOG = "127.0.0.1:1"  # nothing to tail: the indexer starts, NOT_SERVING, and holds its directory


def test_a_second_indexer_on_a_written_index_dir_refuses_to_start(launch: Launch, tmp_path: Path) -> None:
    index_dir = tmp_path / "index"
    first = launch("indexer", "--index-dir", str(index_dir), "--commitlog", _NO_COMMITLOG, serving_only=False)
    second = subprocess.run([sys.executable, "-m", MODULES["indexer"], "--bind", f"127.0.0.1:{free_port()}", "--index-dir", str(index_dir),
                             "--commitlog", _NO_COMMITLOG], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    lines = [line for line in second.stderr.splitlines() if line.strip()]
    assert second.returncode == 2 and len(lines) == 1, second.stderr
    assert "refusing to start" in lines[0] and "--index-dir [env QUARRY_INDEX_DIR]" in lines[0] and "another writer" in lines[0]
    assert first.proc is not None and first.proc.poll() is None  # the first one goes on
    reader = launch("indexer", "--index-dir", str(index_dir), "--commitlog", _NO_COMMITLOG, "--read-only", "true")  # beside it: takes nothing
    assert reader.stop() == 0
    assert first.stop() == 0
    again = launch("indexer", "--index-dir", str(index_dir), "--commitlog", _NO_COMMITLOG, serving_only=False)  # free again once it stopped
    assert again.proc is not None and again.proc.poll() is None
