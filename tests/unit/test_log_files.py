"""Reading a commitlog's records from its segment files in another process's place (the
indexer's --commitlog-store-dir): clean records are read, anything else is left to the
commitlog, and segments made or deleted after the reader started are seen."""
from __future__ import annotations

import os
from pathlib import Path

from quarry.formats.segment_walk import list_segments
from quarry.services.stored_message import to_stored
from quarry.services.commitlog.storage.log_files import LogFiles
from quarry.services.commitlog.storage.message_input import NewMessage
from quarry.services.commitlog.storage.store import CommitLogStore, StoreConfig


def _store(d: Path, **kw: object) -> CommitLogStore:
    return CommitLogStore(StoreConfig(store_dir=d, segment_size=1024, **kw))  # type: ignore[arg-type]


def _msg(i: int) -> NewMessage:
    return NewMessage(topic="T", body=f"body-{i}".encode() * 5, keys=[f"k{i}"], unique_key=f"U{i:04d}")


def test_records_read_from_the_files_equal_the_commitlogs_own(tmp_path: Path) -> None:
    store = _store(tmp_path)
    acked = [store.append(_msg(i)) for i in range(40)]
    store.flush()
    assert len(list_segments(tmp_path / "commitlog")) > 3
    files = LogFiles(tmp_path)
    offsets = [a.physical_offset for a in reversed(acked)]
    records, rest = files.read(offsets)
    assert rest == []
    assert [to_stored(r, "b") for r in records] == [to_stored(store.read(o), "b") for o in offsets]
    store.close()


def test_what_is_not_a_clean_record_is_left_to_the_commitlog(tmp_path: Path) -> None:
    store = _store(tmp_path, file_reserved_hours=1.0)
    acked = [store.append(_msg(i)) for i in range(30)]
    store.flush()
    files = LogFiles(tmp_path)
    good, damaged, inside = acked[-1].physical_offset, acked[-2].physical_offset, acked[-3].physical_offset + 3
    seg = store.segments.find(damaged)
    assert seg is not None
    seg.write(damaged + 90, b"\xff")  # a body byte: the CRC fails
    store.flush()
    # Past the end, inside a record, a damaged record: the commitlog says what each is.
    records, rest = files.read([good, damaged, inside, 10**9])
    assert [r.physical_offset for r in records] == [good] and rest == [damaged, inside, 10**9]
    # A segment deleted by retention after the reader listed it.
    old = list_segments(tmp_path / "commitlog")[0][1]
    os.utime(old, (0, 0))
    assert store.delete_expired() == 1
    assert files.read([acked[0].physical_offset]) == ([], [acked[0].physical_offset])
    store.close()


def test_segments_made_after_the_reader_started_are_found(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.append(_msg(0))
    store.flush()
    files = LogFiles(tmp_path)
    later = [store.append(_msg(i)) for i in range(1, 30)]
    store.flush()
    records, rest = files.read([a.physical_offset for a in later])
    assert rest == [] and [r.unique_key for r in records] == [a.unique_key for a in later]
    assert LogFiles(tmp_path / "nowhere").read([0]) == ([], [0])
    store.close()
