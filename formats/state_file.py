"""Small JSON state files (checkpoints, the topic table), replaced atomically and durably.

Written to a temporary file, fsynced, renamed over the old one, and the directory fsynced so
the rename itself survives a power loss: a crash leaves the old file or the new one, never a
mix, and never neither.
"""
from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path
from typing import Any


def write_json_atomic(path: Path, data: Any, indent: int | None = None, sync_dir: bool = True) -> None:
    """Replace `path` with `data` as JSON (see module doc); creates the directory (0700).

    sync_dir=False skips the directory fsync, for a file written on every flush whose previous
    version is always safe to fall back to (the store checkpoint): a lost rename costs a longer
    recovery scan, never a wrong answer, and saves an fsync per flush."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # Per writer: two writers of the same file never rename each other's temporary file.
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=indent)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    if sync_dir:
        fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    """fsync a directory: a rename or unlink in it survives a power cut."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# fastjson, which a RocketMQ broker writes its config files with, writes a map's integer keys
# bare: consumerOffset.json holds {"offsetTable":{"topic@group":{0:12,1:7}}}.
_BARE_INT_KEY = re.compile(r'([{,]\s*)(-?\d+)(\s*:)')


def read_json(path: Path) -> Any:
    """The JSON in `path` (OSError / ValueError when missing or unreadable); a RocketMQ
    broker's file with fastjson's bare integer keys is read too."""
    text = path.read_text()
    try:
        return json.loads(text)
    except ValueError as strict:
        quoted, n = _BARE_INT_KEY.subn(r'\1"\2"\3', text)
        if not n:
            raise
        try:
            return json.loads(quoted)
        except ValueError:
            raise strict from None  # (the error as the file reads, not as rewritten)
