"""bench.runner.source_tree: the one way an A/B bench names another source tree."""
from __future__ import annotations

from pathlib import Path

import pytest

from bench.runner import REPO_DIR, source_tree, tree_python


def test_this_checkout_is_a_tree() -> None:
    assert source_tree(str(REPO_DIR)) == REPO_DIR
    assert Path(tree_python(REPO_DIR)).exists()


def test_directory_without_venv_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no .venv/bin/python"):
        source_tree(str(tmp_path))


@pytest.mark.parametrize("rev", ["no-such-revision", "0" * 40])
def test_unknown_revision_is_refused(rev: str) -> None:
    with pytest.raises(SystemExit, match="is not a commit of this repository"):
        source_tree(f"git:{rev}")
