"""The repository stands alone: documents and code comments point only at files inside it, and
every relative Markdown link resolves to a file or folder that exists."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.vectors import REPO_ROOT

TEXT_SUFFIXES = {".md", ".py", ".proto", ".yaml", ".yml", ".toml", ".txt", ".sh", ".cfg", ".ini"}
TEXT_NAMES = {"Makefile", "Dockerfile", ".dockerignore", ".gitignore"}
# Paths that lead out of a clone: the folder beside it, or this machine's absolute work paths.
OUTSIDE = re.compile(r"\.\./shared|/work/[A-Za-z]")
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO_ROOT,
                         capture_output=True, check=True, timeout=60).stdout.decode()
    return [REPO_ROOT / n for n in out.split("\0") if n and (REPO_ROOT / n).is_file()]


def _text_files() -> list[Path]:
    files = [p for p in _tracked() if p.suffix in TEXT_SUFFIXES or p.name in TEXT_NAMES]
    assert files, f"no text files found under {REPO_ROOT}"
    return files


def test_nothing_points_outside_the_repository() -> None:
    hits = []
    for path in _text_files():
        if path == Path(__file__):
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                hits.append(f"{path.relative_to(REPO_ROOT)}:{n}: {line.strip()[:120]}")
    assert not hits, "\n".join(hits)


def test_relative_markdown_links_resolve_inside_the_repository() -> None:
    docs = [p for p in _text_files() if p.suffix == ".md"]
    assert any(p.name == "architecture.md" for p in docs)
    broken = []
    for doc in docs:
        for target in MD_LINK.findall(doc.read_text()):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL or an anchor in the same page
            resolved = (doc.parent / target.split("#")[0]).resolve()
            if not resolved.is_relative_to(REPO_ROOT) or not resolved.exists():
                broken.append(f"{doc.relative_to(REPO_ROOT)}: ({target})")
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("bad", ["see ../shared/DESIGN.md", "[x](../shared/golden/README.md)", "/work/shared/golden"])
def test_the_check_catches_links_out(bad: str) -> None:
    assert OUTSIDE.search(bad)
