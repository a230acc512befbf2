"""The PySpark pipeline on local[2]: reindex (equal to the indexer's own result, and handed
over to a running indexer), export (rows equal the decoded records), lookup (the router's
rules), and the corrupt-record policy. Golden RocketMQ stores are read from copies."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import grpc
import pytest

from quarry.formats.body import readable_body
from quarry.formats.dispatch import dispatch_info
from quarry.formats.index_keys import index_names
from quarry.formats.segment_walk import WalkResult, walk_segments
from quarry.pipeline.cli import build_parser, run
from quarry.pipeline.corrupt import CorruptRecordError
from quarry.pipeline.jobs import JobError
from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, indexer_pb2, indexer_pb2_grpc
from quarry.services.indexer.index_store import IndexStore, IndexStoreConfig
from tests.e2e.conftest import Launch, wait_until
from tests.vectors import glob, golden_cases


def _scenarios(root: Path) -> list[Any]:
    return [pytest.param(p.parent, id=p.parent.name) for p in glob("messages/*/scenario.json")]

SPARK = ["--master", "local[2]", "--quiet", "--shuffle-partitions", "2"]


def job(*argv: str) -> Any:
    return run(build_parser().parse_args(list(argv)))


def _copy(scenario: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "stores" / scenario.name
    shutil.copytree(scenario / "commitlog", dst / "commitlog")
    return dst


@golden_cases("scenario", _scenarios)
def test_reindex_equals_sequential_indexing_of_every_golden_store(scenario: Path, tmp_path: Path) -> None:
    store = _copy(scenario, tmp_path)
    summary = job("reindex", "--store", f"b={store}", "--out", str(tmp_path / "out"), "--hash-slots", "101", "--index-num", "40", "--split-bytes", "600", *SPARK)
    assert summary.ok and summary.corrupt_count == 0
    walked = WalkResult()
    records = [dispatch_info(r) for r in walk_segments(store / "commitlog", result=walked)]
    sequential = IndexStore.open(tmp_path / "seq", IndexStoreConfig(hash_slot_num=101, index_num=40))
    sequential.index_records(records)
    rebuilt = IndexStore.open(tmp_path / "out" / "b" / "index", IndexStoreConfig(hash_slot_num=101, index_num=40))
    keys = {(r.topic, n.split("#", 1)[1]) for r in records for n in index_names(r.topic, r.keys, r.unique_key)}
    for topic, key in sorted(keys):
        assert sorted(rebuilt.query(topic, key, 64, 0, 2**62)) == sorted(sequential.query(topic, key, 64, 0, 2**62)), (topic, key)
    checkpoint = json.loads((tmp_path / "out" / "b" / "quarry-index-checkpoint.json").read_text())
    assert checkpoint["next_offset"] == walked.end_offset
    sequential.close()
    rebuilt.close()


def test_reindexed_store_is_continued_by_the_indexer_without_gap_or_repeat(tmp_path: Path, launch: Launch) -> None:
    args = ["--store-dir", str(tmp_path / "store"), "--segment-size", "8192"]
    cl = launch("commitlog", *args, host="127.0.0.71")
    with grpc.insecure_channel(cl.address) as ch:
        stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
        first = [stub.SendMessage(commitlog_pb2.SendMessageRequest(message=common_pb2.MessageInput(topic="P", body=b"x" * 100, keys=["all", f"k{i}"], queue_id=-1)), timeout=5).result for i in range(120)]
    cl.stop()
    summary = job("reindex", "--store", f"broker-p={tmp_path / 'store'}", "--out", str(tmp_path / "ix"), "--hash-slots", "101", "--index-num", "100", *SPARK)
    assert summary.ok and summary.records == 120
    cl = launch("commitlog", *args, host="127.0.0.71", port=int(cl.address.rsplit(":", 1)[1]))
    ix = launch("indexer", "--index-dir", str(tmp_path / "ix" / "broker-p"), "--commitlog", cl.address, "--hash-slots", "101", "--index-num", "100", "--flush-interval-ms", "50", host="127.0.0.71")
    with grpc.insecure_channel(cl.address) as ch, grpc.insecure_channel(ix.address) as ich:
        stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
        later = [stub.SendMessage(commitlog_pb2.SendMessageRequest(message=common_pb2.MessageInput(topic="P", body=b"y", keys=["all", f"n{i}"], queue_id=-1)), timeout=5).result for i in range(10)]
        istub = indexer_pb2_grpc.IndexerServiceStub(ich)
        wait_until(lambda: istub.QueryMessage(indexer_pb2.QueryMessageRequest(topic="P", key="n9"), timeout=5).messages, what="tail continued after the rebuild")
        for r in first + later:
            key = f"k{first.index(r)}" if r in first else f"n{later.index(r)}"
            got = istub.QueryMessage(indexer_pb2.QueryMessageRequest(topic="P", key=key), timeout=5).messages
            assert [m.commit_log_offset for m in got] == [r.physical_offset], key
        status = istub.GetIndexStatus(indexer_pb2.GetIndexStatusRequest(), timeout=5)
        assert status.total_entries == 2 * 130  # each message's two keys exactly once
    # While the indexer writes the directory, --overwrite does not replace it under it.
    held = sorted(p.relative_to(tmp_path) for p in (tmp_path / "ix" / "broker-p").rglob("*"))
    with pytest.raises(JobError, match="has another writer"):
        job("reindex", "--store", f"broker-p={tmp_path / 'store'}", "--out", str(tmp_path / "ix"), "--hash-slots", "101", "--index-num", "100", "--overwrite", *SPARK)
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "ix" / "broker-p").rglob("*")) == held
    assert ix.stop() == 0
    assert job("reindex", "--store", f"broker-p={tmp_path / 'store'}", "--out", str(tmp_path / "ix"), "--hash-slots", "101", "--index-num", "100",
               "--overwrite", *SPARK).records == 130  # free once it stopped


@golden_cases("scenario", _scenarios)
def test_export_rows_equal_the_decoded_records(scenario: Path, tmp_path: Path) -> None:
    from pyspark.sql import SparkSession

    store = _copy(scenario, tmp_path)
    summary = job("export", "--store", f"gold={store}", "--out", str(tmp_path / "cat"), "--with-body", *SPARK)
    assert summary.ok
    rows = SparkSession.builder.getOrCreate().read.parquet(str(tmp_path / "cat")).collect()
    records = list(walk_segments(store / "commitlog"))
    assert len(rows) == len(records) == summary.records
    by_offset = {r["physical_offset"]: r for r in rows}
    for rec in records:
        row = by_offset[rec.physical_offset]
        assert (row["broker"], row["topic"], row["queue_id"], row["queue_offset"], row["offset_msg_id"]) == ("gold", rec.topic, rec.queue_id, rec.queue_offset, rec.offset_msg_id)
        assert list(row["keys"] or []) == rec.keys and (row["unique_key"] or None) == rec.unique_key
        # The body as a reader gets it (inflated when stored compressed); the CRC is the stored record's.
        assert bytes(row["body"]) == readable_body(rec.body, rec.sys_flag) and row["body_crc"] == rec.body_crc and row["store_timestamp"] == rec.store_timestamp


def test_lookup_applies_the_routers_rules(tmp_path: Path, launch: Launch) -> None:
    cl = launch("commitlog", "--store-dir", str(tmp_path / "store"), host="127.0.0.72")
    with grpc.insecure_channel(cl.address) as ch:
        stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)

        def send(keys: list[str], uid: str, topic: str = "L") -> common_pb2.SendResult:
            return stub.SendMessage(commitlog_pb2.SendMessageRequest(message=common_pb2.MessageInput(topic=topic, body=b"b", keys=keys, unique_key=uid, queue_id=-1)), timeout=5).result

        aa = send(["Aa"], "U1")
        bb = send(["BB"], "U2")
        other = send(["Aa"], "U3", topic="M")
        copy1 = send(["dup"], "SAME")
        copy2 = send(["dup"], "SAME")
    cl.stop()
    job("export", "--store", f"br={tmp_path / 'store'}", "--out", str(tmp_path / "cat"), *SPARK)
    (tmp_path / "keys.txt").write_text("L Aa\nL BB\nL nothing\n")
    job("lookup", "--catalog", str(tmp_path / "cat"), "--queries", str(tmp_path / "keys.txt"), "--type", "key", "--out", str(tmp_path / "k.json"), "--format", "json", "--single-file", *SPARK)
    found = [json.loads(line) for p in sorted((tmp_path / "k.json").glob("*.json")) for line in p.read_text().splitlines()]
    hits = {(r["query"], r.get("offset_msg_id")) for r in found if r["found"]}
    assert hits == {("Aa", aa.offset_msg_id), ("BB", bb.offset_msg_id)}
    assert other.offset_msg_id not in {h[1] for h in hits}
    assert [r["found"] for r in found if r["query"] == "nothing"] == [False]
    (tmp_path / "u.txt").write_text("L SAME\n")
    job("lookup", "--catalog", str(tmp_path / "cat"), "--queries", str(tmp_path / "u.txt"), "--type", "unique-key", "--out", str(tmp_path / "u.json"), "--format", "json", "--single-file", *SPARK)
    (u,) = [json.loads(line) for p in sorted((tmp_path / "u.json").glob("*.json")) for line in p.read_text().splitlines()]
    assert u["offset_msg_id"] == copy1.offset_msg_id and u["matches"] == 2
    (tmp_path / "ids.txt").write_text(f"{copy2.offset_msg_id}\n")
    job("lookup", "--catalog", str(tmp_path / "cat"), "--queries", str(tmp_path / "ids.txt"), "--type", "msg-id", "--out", str(tmp_path / "i.csv"), "--format", "csv", "--single-file", *SPARK)
    assert copy2.offset_msg_id in "".join(p.read_text() for p in (tmp_path / "i.csv").glob("*.csv"))


def _store_with_records_in_first_segment(tmp_path: Path, needed: int) -> Path:
    """A copy of the first golden store whose first segment holds `needed` records."""
    for p in glob("messages/*/scenario.json"):
        first = sorted((p.parent / "commitlog").iterdir())[0]
        start, end = int(first.name), int(first.name) + first.stat().st_size
        if sum(1 for r in walk_segments(p.parent / "commitlog") if start <= r.physical_offset < end) >= needed:
            return _copy(p.parent, tmp_path)
    pytest.fail(f"no golden store under {p.parent.parent} has {needed} records in its first segment")


def test_a_corrupt_record_fails_the_job_naming_file_and_offset_unless_skipped(tmp_path: Path) -> None:
    store = _store_with_records_in_first_segment(tmp_path, 4)
    seg = sorted((store / "commitlog").iterdir())[0]
    records = list(walk_segments(store / "commitlog"))
    victim = records[3]
    data = bytearray(seg.read_bytes())
    data[victim.physical_offset + 90] ^= 0xFF  # a body byte: CRC mismatch
    seg.write_bytes(data)
    with pytest.raises(CorruptRecordError) as err:
        job("export", "--store", f"c={store}", "--out", str(tmp_path / "cat"), *SPARK)
    assert seg.name in err.value.message() and str(victim.physical_offset) in err.value.message()
    summary = job("export", "--store", f"c={store}", "--out", str(tmp_path / "cat2"), "--skip-corrupt", "true", *SPARK)
    assert summary.corrupt_count == 1 and summary.records == len(records) - 1
    assert "corrupt records" in summary.render()


def test_large_store_reindex_export_and_lookup_agree_with_the_services(tmp_path: Path, cluster_factory) -> None:  # type: ignore[no-untyped-def]
    """100,000 messages over several segments, written by the commitlog service and indexed by
    the streaming indexer: the rebuilt index, the catalog and the lookups agree with them."""
    import random

    from quarry.clients.admin import AdminClient
    from scripts.launcher import LocalCluster

    cluster: LocalCluster = cluster_factory(commitlog_args=["--segment-size", str(4 << 20)], indexer_args=["--hash-slots", "50021", "--index-num", "400000"])
    cluster.start_router()
    broker = cluster.add_broker("broker-x", "127.0.0.73")
    n = 100_000
    with grpc.insecure_channel(broker.commitlog.address, options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
        stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
        for start in range(0, n, 2000):
            msgs = [common_pb2.MessageInput(topic="Big", body=b"v" * 64, keys=[f"o-{i}", f"c-{i % 997}"], unique_key=f"{i:032X}", queue_id=(start // 2000) % 4) for i in range(start, start + 2000)]
            stub.SendBatch(commitlog_pb2.SendBatchRequest(messages=msgs), timeout=60)
    cluster.wait_indexed()
    segments = sorted((broker.store_dir / "commitlog").iterdir())
    assert len(segments) >= 4
    job("reindex", "--store", f"broker-x={broker.store_dir}", "--out", str(tmp_path / "rx"), "--hash-slots", "50021", "--index-num", "400000", *SPARK)
    rebuilt = IndexStore.open(tmp_path / "rx" / "broker-x" / "index", IndexStoreConfig(hash_slot_num=50021, index_num=400000, read_only=True))
    rng = random.Random(3)
    sample = rng.sample(range(n), 1000)
    with grpc.insecure_channel(broker.indexer.address) as ich:
        istub = indexer_pb2_grpc.IndexerServiceStub(ich)
        for i in sample:
            for key, uniq in ((f"o-{i}", False), (f"{i:032X}", True), (f"c-{i % 997}", False)):
                streaming = {m.commit_log_offset for m in istub.QueryMessage(indexer_pb2.QueryMessageRequest(topic="Big", key=key, max_num=64, unique_key_flag=uniq), timeout=10).messages}
                assert set(rebuilt.query("Big", key, 64, 0, 2**62)) == streaming, key
    rebuilt.close()

    job("export", "--store", f"broker-x={broker.store_dir}", "--out", str(tmp_path / "cat"), *SPARK)
    from pyspark.sql import SparkSession

    catalog = SparkSession.builder.getOrCreate().read.parquet(str(tmp_path / "cat"))
    assert catalog.count() == n
    picked = {r["offset_msg_id"]: r for r in catalog.where("queue_offset % 997 = 5").collect()}
    with grpc.insecure_channel(broker.commitlog.address) as ch:
        stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
        for msg_id, row in list(picked.items())[:100]:
            m = stub.ViewMessage(commitlog_pb2.ViewMessageRequest(physical_offset=row["physical_offset"]), timeout=5).message
            assert (m.offset_msg_id, m.unique_key, list(m.keys), m.store_timestamp, m.queue_offset, m.body_crc) == (msg_id, row["unique_key"], list(row["keys"]), row["store_timestamp"], row["queue_offset"], row["body_crc"])

    keys = [f"c-{k}" for k in rng.sample(range(997), 20)]
    (tmp_path / "q.txt").write_text("".join(f"Big {k}\n" for k in keys))
    job("lookup", "--catalog", str(tmp_path / "cat"), "--queries", str(tmp_path / "q.txt"), "--type", "key", "--max-num", "64", "--out", str(tmp_path / "l.json"), "--format", "json", "--single-file", *SPARK)
    rows = [json.loads(line) for p in sorted((tmp_path / "l.json").glob("*.json")) for line in p.read_text().splitlines()]
    assert cluster.router is not None
    with AdminClient(cluster.router.address) as admin:
        for k in keys:
            routed = {m.offset_msg_id for m in admin.query_by_key("Big", k, max_num=64).messages}
            assert {r["offset_msg_id"] for r in rows if r["query"] == k and r["found"]} == routed, k


def _pipeline(*argv: str, cwd: Path) -> Any:
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "quarry.pipeline", *argv], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_a_failing_job_prints_one_line_and_the_stacks_only_with_verbose(tmp_path: Path) -> None:
    (tmp_path / "not-a-catalog").mkdir()
    (tmp_path / "q.txt").write_text("OrderTopic order-1\n")
    argv = ["lookup", "--catalog", str(tmp_path / "not-a-catalog"), "--queries", str(tmp_path / "q.txt"), "--type", "key",
            "--out", str(tmp_path / "out"), "--master", "local[1]", "--quiet"]
    quiet = _pipeline(*argv, cwd=tmp_path)
    assert quiet.returncode == 1
    assert quiet.stderr.splitlines() == ["quarry-pipeline lookup: failed: AnalysisException: [UNABLE_TO_INFER_SCHEMA] Unable to infer schema for Parquet. It must be specified manually."]
    verbose = _pipeline(*argv, "--verbose", cwd=tmp_path)
    assert verbose.returncode == 1 and "quarry-pipeline lookup: failed: AnalysisException" in verbose.stderr
    assert "Traceback (most recent call last)" in verbose.stderr and "org.apache.spark" in verbose.stderr


def test_progress_counts_only_the_written_part_of_a_preallocated_segment(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from quarry.services.commitlog.storage.message_input import NewMessage
    from quarry.services.commitlog.storage.store import CommitLogStore, StoreConfig

    store = CommitLogStore(StoreConfig(store_dir=tmp_path / "pre", segment_size=32 << 20))
    store.append_many([NewMessage(topic="PreTopic", body=b"y" * 60, keys=[f"p{i}"]) for i in range(3000)])
    written = store.write_offset
    store.close()
    summary = job("export", "--store", f"pre={tmp_path / 'pre'}", "--out", str(tmp_path / "cat"), "--master", "local[1]",
                  "--progress-interval", "0.2", "--shuffle-partitions", "1")
    assert summary.records == 3000 and summary.bytes == written  # not the 32 MiB file
    done = [ln for ln in capsys.readouterr().err.splitlines() if "decode+write done:" in ln]
    assert len(done) == 1 and "(100.0%)" in done[0] and "3,000 records" in done[0]


def test_lookup_windows_take_the_clis_time_forms(tmp_path: Path) -> None:
    from datetime import datetime, timedelta, timezone

    # The golden store whose most-used key spans the most distinct store times.
    best: tuple[int, Path, str, str, list[Any]] | None = None
    for p in glob("messages/*/scenario.json"):
        records = [r for r in walk_segments(p.parent / "commitlog") if r.topic.isascii()]
        by_key: dict[tuple[str, str], list[Any]] = {}
        for r in records:
            for k in r.keys:
                by_key.setdefault((r.topic, k), []).append(r)
        for (topic, key), recs in by_key.items():
            spread = len({r.store_timestamp for r in recs})
            if best is None or spread > best[0]:
                best = (spread, p.parent, topic, key, recs)
    assert best is not None and best[0] >= 2, "a golden key stored at two or more times"
    _, scenario, topic, key, recs = best
    times = sorted({r.store_timestamp for r in recs})
    begin = end = times[-1]  # one millisecond: the earlier copies are left out
    expected = {r.offset_msg_id for r in recs if begin <= r.store_timestamp <= end}
    assert expected and len(expected) < len(recs)  # the window leaves some copies out
    store = _copy(scenario, tmp_path)
    job("export", "--store", f"g={store}", "--out", str(tmp_path / "cat"), *SPARK)
    (tmp_path / "q.txt").write_text(f"{topic} {key}\n")

    def hits(b: str, e: str, name: str) -> set[str]:
        job("lookup", "--catalog", str(tmp_path / "cat"), "--queries", str(tmp_path / "q.txt"), "--type", "key", "--begin", b, "--end", e,
            "--out", str(tmp_path / name), "--format", "json", "--single-file", *SPARK)
        rows = [json.loads(line) for f in sorted((tmp_path / name).glob("*.json")) for line in f.read_text().splitlines()]
        return {r["offset_msg_id"] for r in rows if r["found"]}

    iso_z = datetime.fromtimestamp(begin / 1000, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    plus2 = datetime.fromtimestamp(end / 1000, timezone(timedelta(hours=2))).isoformat(timespec="milliseconds")
    assert hits(str(begin), str(end), "ms") == expected
    assert hits(iso_z, plus2, "iso") == expected  # 2023-11-14T22:15:00.000Z and …+02:00: the same instants
    with pytest.raises(SystemExit):
        build_parser().parse_args(["lookup", "--queries", "q", "--type", "key", "--out", "o", "--begin", str(begin // 1000)])  # seconds
