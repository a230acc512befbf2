"""A segment allocates its blocks ahead of the writes (services/commitlog/storage/segments.py) only as
room allows: near a full disk a write that fits is stored, and one that does not fails with
ENOSPC, storing nothing past what fit."""
from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Iterator

import pytest

from quarry.services.commitlog.storage.segments import ALLOCATE_AHEAD, Segment
from tests.filesystems import small_tmpfs


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path, "4m") as mnt:
        yield mnt


def test_a_write_that_fits_is_stored_though_the_room_ahead_is_not_there(small_fs: Path) -> None:
    size = 4 * ALLOCATE_AHEAD  # a segment far larger than the disk (a sparse file)
    segment = Segment(small_fs / "00000000000000000000", 0, size, read_only=False, create=True)
    try:
        record = os.urandom(1024)
        at = 0
        for _ in range(1024):  # 1 MiB on a 4 MiB disk
            segment.write(at, record)
            at += len(record)
        assert segment.read(0, 1024) == record and segment.read(at - 1024, 1024) == record
        # The disk really full: the write fails as a full disk does.
        with pytest.raises(OSError) as full:
            for _ in range(8 * 1024):
                segment.write(at, record)
                at += len(record)
        assert full.value.errno == errno.ENOSPC
        assert segment.read(0, 1024) == record
    finally:
        segment.close()
