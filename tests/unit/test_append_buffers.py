"""The append's own buffers and shortcuts (services/commitlog/storage/append.py) change no byte: the
write buffer kept from one batch for the next (never zeroed again, so any byte it would write
that no record covers would be a stale one), records packed through a view of that buffer (a
view must be let go of before the buffer grows or is reused), and an unset protobuf born_host
told by HasField instead of being read."""
from __future__ import annotations

from pathlib import Path

import pytest

from quarry.formats.properties import message_properties
from quarry.formats.record import encode_record
from quarry.services.commitlog.storage.errors import InvalidArgument
from quarry.services.commitlog.storage.message_input import NewMessage
from quarry.services.commitlog.storage.store import CommitLogStore, StoreConfig
from quarry.v1 import common_pb2


def _check(store: CommitLogStore, msgs: list, appended, born=("127.0.0.1", 1)) -> None:  # type: ignore[no-untyped-def]
    for m, r in zip(msgs, appended):
        _, stored = store.read_bytes(r.physical_offset)
        assert stored == encode_record(
            topic=m.topic, body=m.body, properties=message_properties(m.keys, m.tags, m.unique_key, m.properties),
            queue_id=r.queue_id, flag=m.flag, queue_offset=r.queue_offset, physical_offset=r.physical_offset, sys_flag=0,
            born_timestamp=r.store_timestamp, born_host=born, store_timestamp=r.store_timestamp, store_host=store.config.store_host)


def _log_bytes_past_the_end_are_zero(store: CommitLogStore) -> bool:
    end = store.state.write_offset
    return set(store.state.segments.segment_at(end).read(end, 1 << 16)) <= {0}


def test_a_big_batch_then_small_ones_write_only_their_own_bytes(tmp_path: Path) -> None:
    store = CommitLogStore(StoreConfig(store_dir=tmp_path, segment_size=1 << 22))
    try:
        big = [NewMessage(topic="T", body=bytes([i % 251 + 1]) * 3000, keys=[f"k{i}"], born_host=("127.0.0.1", 1)) for i in range(200)]
        _check(store, big, store.append_many(big))
        kept = store._appender._scratch
        assert kept is not None and len(kept) >= 200 * 3000  # kept for the next batch
        for size in (10, 1, 700):
            small = [NewMessage(topic="T", body=b"s" * size, born_host=("127.0.0.1", 1)) for _ in range(3)]
            _check(store, small, store.append_many(small))
            assert store._appender._scratch is kept  # reused, not allocated (and zeroed) again
            assert _log_bytes_past_the_end_are_zero(store)
    finally:
        store.close()


def test_records_bigger_than_the_first_grow_the_buffer(tmp_path: Path) -> None:
    # The first record sizes the buffer; the next ones do not fit and it grows under the view.
    store = CommitLogStore(StoreConfig(store_dir=tmp_path, segment_size=1 << 24))
    try:
        msgs = [NewMessage(topic="T", body=b"a", born_host=("127.0.0.1", 1))] + [NewMessage(topic="T", body=b"b" * 100_000, born_host=("127.0.0.1", 1)) for _ in range(5)]
        _check(store, msgs, store.append_many(msgs))
        again = [NewMessage(topic="T", body=b"c" * 200_000, born_host=("127.0.0.1", 1)) for _ in range(3)]
        _check(store, again, store.append_many(again))
        assert _log_bytes_past_the_end_are_zero(store)
    finally:
        store.close()


def test_a_refused_batch_leaves_no_buffer_that_cannot_grow(tmp_path: Path) -> None:
    store = CommitLogStore(StoreConfig(store_dir=tmp_path, segment_size=1 << 22))
    try:
        ok = [NewMessage(topic="T", body=b"x" * 500, born_host=("127.0.0.1", 1)) for _ in range(4)]
        store.append_many(ok)
        for _ in range(2):  # the error keeps its frame (and a view) alive while it is held
            with pytest.raises(InvalidArgument, match=r"messages\[3\]\.body") as held:
                store.append_many(ok[:3] + [NewMessage(topic="T", body=b"", born_host=("127.0.0.1", 1))])
        bigger = [NewMessage(topic="T", body=b"y" * 900, born_host=("127.0.0.1", 1))] + [NewMessage(topic="T", body=b"z" * 50_000, born_host=("127.0.0.1", 1)) for _ in range(4)]
        _check(store, bigger, store.append_many(bigger))
        assert held.value is not None
    finally:
        store.close()


class _Proto:
    """A protobuf-like message (its type has HasField) whose born_host must not be read when unset."""

    def __init__(self, topic: str, body: bytes, born: tuple[str, int] | None) -> None:
        self.topic, self.body, self._born = topic, body, born
        self.keys: list[str] = []
        self.tags = self.unique_key = ""
        self.properties: list[object] = []
        self.flag = self.born_timestamp = self.sys_flag = self.reconsume_times = self.prepared_transaction_offset = 0
        self.queue_id = -1

    def HasField(self, name: str) -> bool:  # noqa: N802 - protobuf's name
        assert name == "born_host"
        return self._born is not None

    unset_reads = 0

    @property
    def born_host(self) -> common_pb2.HostAddress:
        if self._born is None:  # as protobuf does: an empty sub-message, built for the read
            _Proto.unset_reads += 1
            return common_pb2.HostAddress()
        return common_pb2.HostAddress(ip=self._born[0], port=self._born[1])


def test_an_unset_protobuf_born_host_is_the_peer_without_being_read(tmp_path: Path) -> None:
    store = CommitLogStore(StoreConfig(store_dir=tmp_path))
    try:
        msgs = [_Proto("T", b"a", None), _Proto("T", b"b", ("10.0.0.9", 77)), _Proto("T", b"c", ("", 5)), _Proto("T", b"d", None)]
        got = store.append_many(msgs, peer=("10.1.2.3", 4567))
        assert [store.read(r.physical_offset).born_host for r in got] == [("10.1.2.3", 4567), ("10.0.0.9", 77), ("10.1.2.3", 4567), ("10.1.2.3", 4567)]
        assert _Proto.unset_reads == 0
        # Real protobuf messages, and a batch mixing them with in-process ones, read the same way.
        mixed = [common_pb2.MessageInput(topic="T", body=b"p"), NewMessage(topic="T", body=b"n", born_host=("10.0.0.8", 8)),
                 common_pb2.MessageInput(topic="T", body=b"q", born_host=common_pb2.HostAddress(ip="::1", port=9))]
        got = store.append_many(mixed, peer=("10.1.2.3", 4567))
        assert [store.read(r.physical_offset).born_host for r in got] == [("10.1.2.3", 4567), ("10.0.0.8", 8), ("0:0:0:0:0:0:0:1", 9)]  # Java's text for ::1
        with pytest.raises(InvalidArgument, match="born_host"):  # no peer: an unset born host is refused, as before
            store.append_many([_Proto("T", b"a", None)])
    finally:
        store.close()
