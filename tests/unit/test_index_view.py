"""The read-only view of an indexer's IndexFiles (services/indexer/index_view.py) that the
commitlog answers QUERY_MESSAGE from: the indexer's answers, new entries within its refresh,
nothing in the directory written, locked or created, and Unavailable whenever it may answer less."""
from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from quarry.formats.index_file import file_size
from quarry.services.errors import InvalidArgument, Unavailable
from quarry.services.indexer.index_store import IndexStore, IndexStoreConfig
from quarry.services.indexer.index_view import IndexView, open_index_view, query_offsets

SLOTS, NUM, CAP = 11, 10, 5
T0 = 1_700_000_000_000


@dataclass
class Rec:
    physical_offset: int
    topic: str
    keys: str | None
    unique_key: str | None
    store_timestamp: int
    sys_flag: int = 0


def writer(index_dir: Path) -> IndexStore:
    """The indexer's side: a writable store in <index_dir>/index."""
    return IndexStore.open(index_dir / "index", IndexStoreConfig(hash_slot_num=SLOTS, index_num=NUM, max_msgs_num_batch=CAP))


def put(index: IndexStore, first: int, n: int, key: str = "k") -> None:
    index.index_records([Rec(1000 * (first + i), "T", f"{key} k{first + i}", f"U{first + i}", T0 + 1000 * (first + i)) for i in range(n)])


def snapshot(d: Path) -> dict[str, tuple[int, int, str]]:
    return {str(p.relative_to(d)): (p.stat().st_mtime_ns, p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "")
            for p in sorted(d.rglob("*"))}


def wait_for(predicate, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    end, pause = time.monotonic() + timeout_s, threading.Event()
    while not predicate():
        assert time.monotonic() < end, "condition not met before the deadline"
        pause.wait(0.01)


QUERIES = [("T", "k", 64, 0, 2**62, False), ("T", "k", 2, 0, 2**62, False), ("T", "k3", 0, 0, 2**62, False), ("T", "U7", 0, 0, 2**62, True),
           ("T", "k", 64, T0 + 5000, T0 + 9000, False), ("T", "absent", 64, 0, 2**62, False), ("%DLQ%x", "k", 64, 0, 2**62, False)]


def test_the_view_answers_as_the_indexer_and_follows_its_writes(tmp_path: Path) -> None:
    w = writer(tmp_path)
    put(w, 0, 12)  # more entries than a file holds: two files
    view = IndexView(tmp_path, SLOTS, NUM, CAP, interval_ms=20).start()
    try:
        for q in QUERIES:
            assert view.query(*q) == query_offsets(w, *q)[0], q
        assert view.query("T", "k", 64, 0, 2**62) and len(view.query("T", "k", 64, 0, 2**62)) == CAP  # the indexer's cap
        put(w, 12, 30)  # the indexer writes on: new entries and new files, seen within the refresh
        wait_for(lambda: view.query("T", "k41", 64, 0, 2**62) == [41_000])
        for q in QUERIES:
            assert view.query(*q) == query_offsets(w, *q)[0], q
        assert view.last_update() == (w.last_update_timestamp, w.last_update_phy_offset)
        with pytest.raises(InvalidArgument):
            view.query("T", "", 64, 0, 2**62)
        with pytest.raises(InvalidArgument):
            view.query("T", "k", 64, 10, 5)
    finally:
        view.stop()
        w.close()


def test_nothing_in_the_directory_is_written_locked_or_created(tmp_path: Path) -> None:
    w = writer(tmp_path)
    put(w, 0, 25)
    w.close()
    before = snapshot(tmp_path)
    view = IndexView(tmp_path, SLOTS, NUM, CAP, interval_ms=10).start()
    try:
        wait_for(lambda: not view.index.filter_pending())  # the key filters built: every thread has done its work
        rounds = [view.query("T", "k", 64, 0, 2**62) for _ in range(20)]
        assert rounds[0] and all(r == rounds[0] for r in rounds)
    finally:
        view.stop()
    assert snapshot(tmp_path) == before


def test_unavailable_when_it_may_answer_less(tmp_path: Path) -> None:
    assert open_index_view("", SLOTS, NUM, CAP) is None  # not configured: the indexer is asked
    (tmp_path / "a-file").write_text("")
    assert open_index_view(str(tmp_path / "a-file"), SLOTS, NUM, CAP) is None  # not a directory
    w = writer(tmp_path)
    put(w, 0, 3)
    w.close()
    assert open_index_view(str(tmp_path), SLOTS + 1, NUM, CAP) is None  # files sized for another geometry
    view = IndexView(tmp_path, SLOTS, NUM, CAP)  # not started: rounds run here
    try:
        with view.lock:
            view.refresh_locked()
        assert view.query("T", "k", 64, 0, 2**62) == [2000, 1000, 0]
        other = tmp_path / "index" / "29991231235959999"  # newer, sized for other settings: never opened
        other.write_bytes(bytes(file_size(SLOTS + 1, NUM)))
        with view.lock:
            view.refresh_locked()
        with pytest.raises(Unavailable):
            view.query("T", "k", 64, 0, 2**62)
        other.unlink()
        with view.lock:
            view.refresh_locked()
        assert view.query("T", "k", 64, 0, 2**62) == [2000, 1000, 0]
    finally:
        view.index.close()


def test_a_directory_the_indexer_has_not_made_yet_is_waited_for(tmp_path: Path) -> None:
    """The commitlog usually starts before its indexer: until the directory is there, key
    queries ask the indexer; once it is, the view answers from it (nothing made meanwhile)."""
    later = tmp_path / "indexer"
    view = open_index_view(str(later), SLOTS, NUM, CAP, interval_ms=20)
    assert view is not None
    try:
        with pytest.raises(Unavailable, match="does not exist"):
            view.query("T", "k", 64, 0, 2**62)
        assert not later.exists()
        w = writer(later)
        put(w, 0, 3)
        wait_for(lambda: _answers(view) == [2000, 1000, 0])
        w.close()
    finally:
        view.stop()


def _answers(view: IndexView) -> list[int] | None:
    try:
        return view.query("T", "k", 64, 0, 2**62)
    except Unavailable:
        return None
