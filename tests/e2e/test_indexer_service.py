"""The indexer as a real process: collisions shown (not filtered), bad input, an absent
commitlog, catching up after the commitlog restarts, and SIGKILL recovery."""
from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, indexer_pb2, indexer_pb2_grpc
from scripts.launcher import free_port
from tests.e2e.conftest import Launch, wait_until

HOST = "127.0.0.6"


def _send(addr: str, keys: list[str], uid: str = "", topic: str = "T") -> common_pb2.SendResult:
    with grpc.insecure_channel(addr) as ch:
        msg = common_pb2.MessageInput(topic=topic, body=b"b", keys=keys, unique_key=uid, queue_id=-1)
        return commitlog_pb2_grpc.CommitLogServiceStub(ch).SendMessage(commitlog_pb2.SendMessageRequest(message=msg), timeout=5).result


def _query(addr: str, key: str, **kw: object) -> indexer_pb2.QueryMessageResponse:
    with grpc.insecure_channel(addr) as ch:
        return indexer_pb2_grpc.IndexerServiceStub(ch).QueryMessage(indexer_pb2.QueryMessageRequest(topic=kw.pop("topic", "T"), key=key, **kw), timeout=5)  # type: ignore[arg-type]


def _status(addr: str) -> indexer_pb2.GetIndexStatusResponse:
    with grpc.insecure_channel(addr) as ch:
        return indexer_pb2_grpc.IndexerServiceStub(ch).GetIndexStatus(indexer_pb2.GetIndexStatusRequest(), timeout=5)


@pytest.fixture
def broker(launch: Launch, tmp_path: Path):  # type: ignore[no-untyped-def]
    cl_port = free_port(HOST)
    cl_args = ["--store-dir", str(tmp_path / "store"), "--segment-size", "65536", "--flush-interval-ms", "50"]
    cl = launch("commitlog", *cl_args, host=HOST, port=cl_port)
    ix_args = ["--index-dir", str(tmp_path / "index"), "--commitlog", cl.address, "--hash-slots", "11", "--index-num", "50", "--flush-interval-ms", "50"]
    ix = launch("indexer", *ix_args, host=HOST)
    return {"cl": cl, "ix": ix, "cl_args": cl_args, "ix_args": ix_args, "cl_port": cl_port}


def test_hash_collisions_never_leave_the_indexer(broker) -> None:  # type: ignore[no-untyped-def]
    """Issue 33, 2: the index answers by hash, but a record of another key or topic with the
    same hash is never returned (it is counted), on this door as on the router's."""
    cl, ix = broker["cl"].address, broker["ix"].address
    sent = {k: _send(cl, [k]).physical_offset for k in ("Aa", "BB", "AaAa", "BBBB", "AaBB")}
    secret = _send(cl, ["Aa"], topic="TopicSecret").physical_offset  # "TopicSecret#Aa" differs: no collision by hash needed
    wait_until(lambda: _status(ix).index_last_update_phy_offset == secret, what="all indexed")
    aa = _query(ix, "Aa")
    assert [m.commit_log_offset for m in aa.messages] == [sent["Aa"]] and aa.collisions_filtered == 1  # BB: same hash
    bbbb = _query(ix, "BBBB")
    assert [m.commit_log_offset for m in bbbb.messages] == [sent["BBBB"]] and bbbb.collisions_filtered == 2
    assert [m.topic for m in _query(ix, "Aa", topic="TopicSecret").messages] == ["TopicSecret"]
    resp = _query(ix, "Aa")
    assert resp.index_last_update_phy_offset == secret and resp.index_last_update_timestamp > 0


@pytest.mark.parametrize(
    ("kw", "field"),
    [({"topic": ""}, "topic"), ({"key": ""}, "key"), ({"max_num": -1}, "max_num"), ({"begin_timestamp": 10, "end_timestamp": 5}, "begin_timestamp"), ({"key": "k" * 5000}, "key"), ({"before_phy_offset": -1}, "before_phy_offset")],
)
def test_bad_input_names_the_field(broker, kw: dict, field: str) -> None:  # type: ignore[no-untyped-def]
    key = kw.pop("key", "k")
    with pytest.raises(grpc.RpcError) as err:
        _query(broker["ix"].address, key, **kw)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in err.value.details()


def test_tailer_catches_up_after_commitlog_restart_and_unavailable_is_not_empty_success(broker, launch: Launch) -> None:  # type: ignore[no-untyped-def]
    cl, ix = broker["cl"], broker["ix"].address
    first = _send(cl.address, ["before"])
    wait_until(lambda: _query(ix, "before").messages, what="first key indexed")
    cl.stop()
    with pytest.raises(grpc.RpcError) as err:
        _query(ix, "before")
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    wait_until(lambda: not _status(ix).tail_connected, what="tail disconnected")
    cl2 = launch("commitlog", *broker["cl_args"], host=HOST, port=broker["cl_port"])
    after = [_send(cl2.address, ["after", f"a{i}"]).physical_offset for i in range(20)]
    got = wait_until(lambda: (r := _query(ix, "after")) and len(r.messages) == 20 and r, what="catch-up")
    assert sorted(m.commit_log_offset for m in got.messages) == after
    assert [m.commit_log_offset for m in _query(ix, "before").messages] == [first.physical_offset]
    st = _status(ix)
    assert st.tail_connected and st.lag_bytes == 0 and st.total_entries == 1 + 40


def test_index_survives_sigkill_and_is_exact_afterwards(broker, launch: Launch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cl, ix = broker["cl"].address, broker["ix"]
    offsets = [_send(cl, ["same", f"u{i}"], uid=f"UID{i}").physical_offset for i in range(40)]
    wait_until(lambda: len(_query(ix.address, "u39").messages) == 1, what="indexed")
    ix.kill()
    more = [_send(cl, ["same"]).physical_offset for _ in range(10)]
    again = launch("indexer", *broker["ix_args"], host=HOST)
    got = wait_until(lambda: (r := _query(again.address, "same", max_num=64)) and len(r.messages) == 50 and r, what="all 50 after restart")
    assert sorted(m.commit_log_offset for m in got.messages) == sorted(offsets + more)
    assert len({m.commit_log_offset for m in got.messages}) == 50
    for i in (0, 17, 39):
        assert [m.commit_log_offset for m in _query(again.address, f"UID{i}", unique_key_flag=True).messages] == [offsets[i]]


def _log_end(addr: str) -> int:
    with grpc.insecure_channel(addr) as ch:
        return commitlog_pb2_grpc.CommitLogServiceStub(ch).GetStoreStatus(commitlog_pb2.GetStoreStatusRequest(), timeout=5).max_offset


@pytest.mark.parametrize(("garbage", "indexer_away"), [(False, False), (True, False), (False, True)],
                         ids=["cut", "cut-then-garbage", "cut-and-rewritten-while-the-indexer-was-away"])
def test_an_index_ahead_of_a_repaired_log_drops_what_the_log_lost_and_goes_on(broker, launch: Launch, tmp_path: Path, garbage: bool, indexer_away: bool) -> None:  # type: ignore[no-untyped-def]
    """Issue 32, 1: the log loses its tail below what the indexer had indexed. The indexer drops
    the entries of records the log no longer holds, resumes where the log now ends, says so
    once, and every message sent afterwards is found by key. With the indexer away while new
    records (all the same size) are written over the cut, its old checkpoint lands on a record
    boundary of the new log: only the records' identity can tell."""
    cl, ix = broker["cl"], broker["ix"]
    old = [_send(cl.address, [f"old{i:02d}", "k"]) for i in range(30)]
    end = _log_end(cl.address)
    wait_until(lambda: _status(ix.address).checkpoint_offset == end, what="everything indexed")
    cut = old[20].physical_offset
    if indexer_away:
        ix.stop()
    cl.kill()
    segment = tmp_path / "store" / "commitlog" / f"{0:020d}"
    with open(segment, "r+b") as fh:  # a hand repair: the file cut mid-record 20 (the rest zero or garbage)
        fh.truncate(cut + 30)
        if garbage:
            fh.seek(cut + 30)
            fh.write(b"\xa5" * 4096)
    cl = launch("commitlog", *broker["cl_args"], host=HOST, port=broker["cl_port"])
    assert _log_end(cl.address) == cut
    new = [_send(cl.address, [f"new{i:02d}", "k"]) for i in range(15)]
    assert new[10].physical_offset == end  # the old checkpoint is a record start again
    if indexer_away:
        ix = launch("indexer", *broker["ix_args"], host=HOST)
    got = wait_until(lambda: (r := _query(ix.address, "k", max_num=64)) and len(r.messages) == 35 and r, what="every record the log holds, found by key")
    assert sorted(m.commit_log_offset for m in got.messages) == sorted([r.physical_offset for r in old[:20] + new])
    assert {m.keys[0] for m in got.messages} == {f"old{i:02d}" for i in range(20)} | {f"new{i:02d}" for i in range(15)}
    for i in (20, 29):
        assert not _query(ix.address, f"old{i:02d}").messages  # a record the repair dropped is never served
    for i in (0, 14):
        assert [m.commit_log_offset for m in _query(ix.address, f"new{i:02d}").messages] == [new[i].physical_offset]
    st = _status(ix.address)
    assert st.tail_connected and st.checkpoint_offset == _log_end(cl.address) and st.total_entries == 2 * 35
    reported = [p for p in st.problems if "no longer holds" in p]
    assert len(reported) == 1 and "20 index entries" in reported[0] and f"resumes at {cut}" in reported[0], st.problems
    lines = [line for line in ix.log_path.read_text().splitlines() if "index ahead of the log" in line]
    assert len(lines) == 1, lines
