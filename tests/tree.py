"""A directory's state, for tests that check a process left a directory exactly as it found it."""
from __future__ import annotations

import hashlib
from pathlib import Path


def tree_snapshot(root: Path) -> dict[str, tuple[int, int, str]]:
    """Every path under root with its size, mtime and SHA-256 (directories too): equal before and
    after means nothing was written, created, touched or removed."""
    out: dict[str, tuple[int, int, str]] = {}
    for p in sorted(root.rglob("*")):
        st = p.stat()
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns, digest)
    return out
