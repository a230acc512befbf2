"""The dispatch infos of the newest appended records, kept in memory.

A Tail reader that keeps up asks for what was just written; serving it from here saves
re-reading and re-decoding the log (about half the commitlog's CPU under a streaming
indexer). A reader further behind than the cache falls back to reading the log. Memory: about 400
bytes a record (32,768 records by default: ~13 MB, at most 1.25 times that).

Entries are kept as plain tuples, not DispatchInfo: the garbage collector stops tracking a
plain tuple of strings and numbers, but never a NamedTuple, and tens of thousands of tracked
long-lived entries made full collections run every few dozen batches (about a tenth of the
send path's CPU). A reader gets DispatchInfo back.
"""
from __future__ import annotations

import bisect
import threading
from operator import itemgetter
from typing import Callable, Sequence, cast

from quarry.formats.dispatch import DispatchInfo
from quarry.services.commitlog.storage.dispatchers import Row


_offset = itemgetter(0)  # DispatchInfo.physical_offset
_as_info = tuple.__new__  # DispatchInfo from a plain tuple of its fields, without re-checking them
_plain = cast("Callable[[Row], Row]", tuple)  # a DispatchInfo as the plain tuple of its fields


class DispatchCache:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._offsets: list[int] = []
        self._infos: list[Row] = []
        self._lock = threading.Lock()

    def dispatch(self, infos: Sequence[Row]) -> None:
        """Records just placed, in log order (the caller holds the store's append lock): plain
        tuples of DispatchInfo's fields (the append's rows), or DispatchInfos (kept as plain
        tuples), all of one kind. A dispatcher (dispatchers.py)."""
        if self.capacity <= 0 or not infos:
            return  # off: Tail always reads the log
        with self._lock:
            if self._offsets and infos[0][0] <= self._offsets[-1]:
                # Placed again where a failed append had placed records (never served: they lay
                # past the durable end): the log's records from here are these.
                cut = bisect.bisect_left(self._offsets, infos[0][0])
                del self._offsets[cut:]
                del self._infos[cut:]
            if len(infos) == 1 and type(infos[0]) is tuple:  # a single send's row
                self._offsets.append(infos[0][0])
                self._infos.append(infos[0])
            else:
                self._offsets.extend(map(_offset, infos))
                self._infos.extend(infos if type(infos[0]) is tuple else map(_plain, infos))
            if len(self._infos) > self.capacity + self.capacity // 4:  # trim in quarters: amortised O(1) per record
                cut = len(self._infos) - self.capacity
                del self._offsets[:cut]
                del self._infos[:cut]

    def get(self, from_offset: int, max_records: int, until: int) -> tuple[list[DispatchInfo], int] | None:
        """(infos, next offset) of the records starting at from_offset and ending by `until`
        (a record boundary), at most max_records; None when from_offset is not a cached record."""
        with self._lock:
            i = bisect.bisect_left(self._offsets, from_offset)
            if i == len(self._offsets) or self._offsets[i] != from_offset:
                return None
            j = bisect.bisect_left(self._offsets, until, i, min(len(self._offsets), i + max_records))
            if j == i:
                return None
            out = [_as_info(DispatchInfo, t) for t in self._infos[i:j]]
        last = out[-1]
        return out, last.physical_offset + last.size

    def clear(self) -> None:
        with self._lock:
            self._offsets.clear()
            self._infos.clear()
