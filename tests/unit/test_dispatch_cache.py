"""Tail serves the newest records from the dispatch infos the append built; they must equal
what decoding the log yields, for every kind of message."""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pytest

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quarry.formats.scheduled import SCHEDULE_TOPIC
from quarry.services.commitlog.storage import reads as store_module
from quarry.services.commitlog.storage.errors import Expired
from quarry.services.commitlog.storage.message_input import NewMessage
from quarry.services.commitlog.storage.store import CommitLogStore, StoreConfig

_text = st.text(alphabet=st.characters(blacklist_characters="\x01\x02 ", blacklist_categories=("Cs",)), min_size=1, max_size=12)
_messages = st.builds(
    NewMessage,
    topic=st.sampled_from(["T", "Other", SCHEDULE_TOPIC]),
    body=st.binary(min_size=1, max_size=64),
    keys=st.lists(_text, max_size=3),
    tags=st.one_of(st.just(""), _text),
    unique_key=st.one_of(st.just(""), _text),
    properties=st.lists(st.tuples(st.sampled_from(["DELAY", "a", "b", "REAL_TOPIC"]), st.one_of(st.just(""), st.sampled_from(["1", "3", "18", "99", "x"]), _text)), max_size=3),
    queue_id=st.sampled_from([-1, 0, 3]),
    born_host=st.sampled_from([("127.0.0.1", 1), ("::1", 2), ("2001:db8::5", 65535)]),
    sys_flag=st.sampled_from([0, 0x4, 0x8, 0xC, 0x1]),
    prepared_transaction_offset=st.integers(0, 2**40),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(_messages, min_size=1, max_size=5), min_size=1, max_size=6), st.sampled_from([("127.0.0.1", 10911), ("fe80::9", 10911)]))
def test_cached_dispatch_equals_decoding_the_log(batches: list[list[NewMessage]], store_host: tuple[str, int]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        # Tiny segments: batches cross segment ends, so blank records sit between cached runs.
        store = CommitLogStore(StoreConfig(store_dir=Path(tmp), segment_size=2048, store_host=store_host))
        try:
            for batch in batches:
                topic = batch[0].topic
                store.append_many([NewMessage(**{**_fields(m), "topic": topic}) for m in batch])
            store.flush()
            end = store.committed_offset
            served, offset = [], 0
            while offset < end:  # as Tail walks: cache hits, and the log past blanks
                infos, offset = store.read_dispatch(offset, 3, end)
                served += infos
            store.dispatch_cache.clear()
            decoded, offset = [], 0
            while offset < end:
                infos, offset = store.read_dispatch(offset, 3, end)
                decoded += infos
            assert served == decoded
            assert len(decoded) == sum(len(b) for b in batches)
        finally:
            store.close()


def _fields(m: NewMessage) -> dict[str, object]:
    return {name: getattr(m, name) for name in NewMessage.__slots__}


def test_a_reader_behind_the_cache_reads_the_log(tmp_path: Path) -> None:
    store = CommitLogStore(StoreConfig(store_dir=tmp_path, segment_size=1 << 20, dispatch_cache_records=4))
    try:
        for i in range(20):
            store.append(NewMessage("T", b"x", keys=[f"k{i}"]))
        store.flush()
        infos, _ = store.read_dispatch(0, 100, store.committed_offset)
        assert [d.keys for d in infos] == [f"k{i}" for i in range(20)]
        assert store.dispatch_cache.get(0, 100, store.committed_offset) is None  # long evicted
    finally:
        store.close()


@pytest.mark.parametrize("window", [64, 200, 1000])
def test_reading_the_log_in_small_windows_yields_every_record_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, window: int) -> None:
    # Records larger than the window, straddling it, and crossing segment ends.
    monkeypatch.setattr(store_module, "READ_WINDOW", window)
    store = CommitLogStore(StoreConfig(store_dir=tmp_path, segment_size=4096, dispatch_cache_records=0))
    try:
        sizes = [1, 300, 50, 1500, 7, 900, 2000, 3, 3800, 10]
        results = [store.append(NewMessage("T", b"b" * n, keys=[f"k{i}"])) for i, n in enumerate(sizes)]
        store.flush()
        end = store.committed_offset
        got, offset = [], 0
        while offset < end:
            infos, offset = store.read_dispatch(offset, 3, end)
            got += infos
        assert [(d.physical_offset, d.keys) for d in got] == [(r.physical_offset, f"k{i}") for i, r in enumerate(results)]
    finally:
        store.close()


def test_a_reader_whose_segment_expired_is_told_so(tmp_path: Path) -> None:
    store = CommitLogStore(StoreConfig(store_dir=tmp_path, segment_size=4096, dispatch_cache_records=0, file_reserved_hours=0))
    try:
        for i in range(20):
            store.append(NewMessage("T", b"x" * 500, keys=[f"k{i}"]))
        store.flush()
        assert store.delete_expired(now_s=time.time() + 3600) > 0
        with pytest.raises(Expired):
            store.read_dispatch(0, 10, store.committed_offset)
    finally:
        store.close()
