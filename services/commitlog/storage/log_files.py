"""A commitlog's records read straight from its segment files by another process on the same
host (the broker's indexer answering a key query), without a call to the commitlog.

Only what reads cleanly is returned: an offset with no segment, no record, a damaged record or
an unreadable file is left to the caller, which asks the commitlog (GetMessages), so the
commitlog's own rules (expiry, its write end, reporting corruption in its status) still decide
every case but the plain one. The checks on the bytes are the commitlog's own
(`reads.record_at`). Files are opened per read and not kept open: a segment the commitlog
deletes (retention) does not stay pinned on disk by this reader.
"""
from __future__ import annotations

import bisect
import os
from pathlib import Path
from typing import Iterable

from quarry.formats.record import Record, decode_record
from quarry.formats.segment_walk import list_segments
from quarry.services.commitlog.storage.errors import DamagedRecord, NotFound
from quarry.services.commitlog.storage.reads import largest_record, record_at

# The commitlog's --max-message-size default is far below this; a larger record is read by
# the commitlog itself (its own limit applies there).
_LARGEST = largest_record(4 * 1024 * 1024)


class LogFiles:
    """The segment files under `<store_dir>/commitlog`, read-only."""

    def __init__(self, store_dir: Path) -> None:
        self.directory = Path(store_dir) / "commitlog"
        self._starts: list[int] = []
        self._paths: list[Path] = []
        self._refresh()

    def _refresh(self) -> None:
        found = list_segments(self.directory)
        self._starts = [start for start, _ in found]
        self._paths = [path for _, path in found]

    def read(self, offsets: Iterable[int]) -> tuple[list[Record], list[int]]:
        """(records read cleanly, in the order asked; offsets to ask the commitlog for)."""
        records: list[Record] = []
        rest: list[int] = []
        for offset in offsets:
            rec = self._read_one(offset)
            if rec is None:
                rest.append(offset)
            else:
                records.append(rec)
        return records, rest

    def _read_one(self, offset: int) -> Record | None:
        for attempt in (0, 1):
            i = bisect.bisect_right(self._starts, offset) - 1
            if i >= 0:
                try:
                    fd = os.open(self._paths[i], os.O_RDONLY)
                except OSError:
                    fd = -1  # deleted (expired) or renamed: list again
                if fd >= 0:
                    try:
                        start, end = self._starts[i], self._starts[i] + os.fstat(fd).st_size
                        if offset < end:
                            return record_at(lambda at, size: os.pread(fd, max(0, min(size, end - at)), at - start), end, offset, _LARGEST, decode_record)[0]
                    except (NotFound, DamagedRecord, OSError):
                        return None  # the commitlog says what it is
                    finally:
                        os.close(fd)
            if attempt == 0:
                self._refresh()  # a segment made (or dropped) since the last listing
        return None
