"""How a key query's cost grows with the work a broker keeps: latency against the number of
IndexFiles per broker (1, 10, 100, 256) and the number of brokers holding the topic (1, 3, 6),
measured through the router at concurrency 1 beside the echo ceiling of the same sizes; the
store-level cost of the same queries, and the same latencies against each broker's store size;
memory of each service per million indexed keys and per thousand topics. The curves are drawn
into bench/growth_*.png by the same run. File counts are
asked in turn, one query of each per round (one broker per count), so noise falls on all alike.

`.venv/bin/python -m bench growth [--keys-per-file N] [--queries N]`
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path

import grpc

from bench.ceiling import EchoCeiling, Stats, drive
from bench.runner import BENCH_DIR, Result
from quarry.channels import open_channel
from quarry.services.indexer.filter_builder import build_pending
from quarry.services.indexer.index_store import IndexStore, IndexStoreConfig
from quarry.v1 import indexer_pb2, indexer_pb2_grpc
from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, router_pb2, router_pb2_grpc
from scripts.launcher import BrokerProcesses, LocalCluster

FILE_COUNTS = (1, 10, 100, 256)
BROKER_COUNTS = (1, 3, 6)
HOSTS = [f"127.0.0.{81 + i}" for i in range(6)]


class _Doc:
    """Stands for a dispatched record (what IndexStore.index_records reads)."""

    __slots__ = ("physical_offset", "topic", "keys", "unique_key", "store_timestamp", "sys_flag")

    def __init__(self, off: int, topic: str, key: str, ts: int) -> None:
        self.physical_offset, self.topic, self.keys, self.unique_key, self.store_timestamp, self.sys_flag = off, topic, key, None, ts, 0


def _store_level(root: Path, keys_per_file: int, queries: int) -> list[Result]:
    """query_page cost in one process, files built with RocketMQ's proportions (4 entries per
    slot): one store per file count, queried in turn (round-robin), so a busy moment of this
    shared machine lands on every file count alike instead of on whichever ran then."""
    out: list[Result] = []
    config = IndexStoreConfig(hash_slot_num=max(1, keys_per_file // 4), index_num=keys_per_file + 1)
    stores, newest = {}, {}
    for files in FILE_COUNTS:
        store = IndexStore.open(root / f"store-level-{files}", config)
        n, target = 0, files * keys_per_file
        while n < target:
            batch = [_Doc(1000 * (i + 1), "T", f"k-{i}", 1_700_000_000_000 + i) for i in range(n, min(target, n + 4096))]
            store.index_records(batch)
            n += len(batch)
        build_pending(store)  # what the indexer's builder thread does after files seal
        assert not store.unfiltered, "every file is full, so every file is sealed and filtered"
        stores[files], newest[files] = store, [f"k-{i}" for i in range(n - keys_per_file, n)]
    rng = random.Random(1)
    lat: dict[tuple[int, str], list[float]] = {}
    for _ in range(queries):
        for files, store in stores.items():
            for label, k in (("key in newest file", rng.choice(newest[files])), ("absent key", f"absent-{rng.randrange(1 << 30)}")):
                t = time.perf_counter()
                store.query_page("T", k, 64, 0, 2**62)
                lat.setdefault((files, label), []).append((time.perf_counter() - t) * 1e6)
    for (files, label), values in lat.items():
        out.append(Result(f"store query_page p50, {label}", statistics.median(values), "us", {"index_files": len(stores[files].files), "keys_per_file": keys_per_file}))
    big = stores[FILE_COUNTS[-1]]
    out.append(Result("indexer key filter per million indexed keys", big.key_filter.memory_bytes() / 2**20 / (FILE_COUNTS[-1] * keys_per_file / 1e6), "MiB",
                      {"index_files": FILE_COUNTS[-1], "keys_per_file": keys_per_file}))
    for store in stores.values():
        store.close()
    return out


def _rss_kib(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS", "RssAnon", "RssFile")):
            k, v = line.split(":", 1)
            fields[k] = int(v.split()[0])
    return fields


def _send(address: str, topic: str, start: int, count: int, batch: int = 500) -> list[str]:
    """Send `count` messages with keys order-<i>; returns the keys."""
    keys = []
    with open_channel(address, options=[("grpc.max_send_message_length", 128 << 20)]) as ch:
        stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
        for s in range(start, start + count, batch):
            msgs = [common_pb2.MessageInput(topic=topic, body=b"x" * 256, keys=[f"order-{i}"], queue_id=-1) for i in range(s, min(start + count, s + batch))]
            stub.SendBatch(commitlog_pb2.SendBatchRequest(messages=msgs), timeout=60)
            keys += [m.keys[0] for m in msgs]
    return keys


def _query_stats(router: str, topic: str, keys: list[str], queries: int) -> tuple[Stats, int, int]:
    """Key queries through the router at concurrency 1; also the request and response sizes."""
    async def go() -> tuple[Stats, int, int]:
        async with grpc.aio.insecure_channel(router) as ch:
            stub = router_pb2_grpc.QueryRouterServiceStub(ch)
            reqs = [router_pb2.QueryMsgByKeyRequest(topic=topic, key=k) for k in keys]
            sizes = [0, 0]

            async def one(i: int) -> None:
                r = reqs[i % len(reqs)]
                resp = await stub.QueryMsgByKey(r, timeout=10)
                sizes[0], sizes[1] = r.ByteSize(), resp.ByteSize()

            s = await drive(one, queries, 1, warmup=20)
            return s, sizes[0], sizes[1]

    return asyncio.run(go())


def _interleaved(router: str, cases: dict[tuple[int, str], tuple[str, list[str]]], queries: int) -> dict[tuple[int, str], Stats]:
    """Key queries through the router at concurrency 1, the cases asked in turn (one query of
    each per round), so noise on this shared machine falls on every case alike."""
    async def go() -> dict[tuple[int, str], Stats]:
        async with grpc.aio.insecure_channel(router) as ch:
            stub = router_pb2_grpc.QueryRouterServiceStub(ch)
            lat: dict[tuple[int, str], list[float]] = {c: [] for c in cases}
            for i in range(queries + 20):
                for case, (topic, keys) in cases.items():
                    t = time.perf_counter()
                    await stub.QueryMsgByKey(router_pb2.QueryMsgByKeyRequest(topic=topic, key=keys[i % len(keys)]), timeout=10)
                    if i >= 20:  # warm-up rounds are not counted
                        lat[case].append((time.perf_counter() - t) * 1000)
            return {c: Stats.of(len(v) / (sum(v) / 1000), v, 1) for c, v in lat.items()}

    return asyncio.run(go())


def _absent(n: int) -> list[str]:
    return [f"absent-{i}" for i in range(n)]


def _disk_bytes(path: Path, skip: Path | None = None) -> int:
    """Bytes a directory's files occupy on disk (allocated blocks), leaving out `skip`'s tree; a
    file renamed away while it is walked (a checkpoint's temporary file) is not counted."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(path):
        if skip is not None and Path(dirpath) == skip:
            dirnames.clear()
            continue
        for name in filenames:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_blocks * 512
            except FileNotFoundError:
                continue
    return total


def _store_bytes(broker: BrokerProcesses) -> int:
    """What a broker keeps: the log's records (min to max offset; its segments are allocated
    ahead of the writes, so their blocks overstate it) and the blocks of its other files (queues,
    checkpoints, IndexFiles)."""
    with open_channel(broker.commitlog.address) as ch:  # type: ignore[union-attr]
        status = commitlog_pb2_grpc.CommitLogServiceStub(ch).GetStoreStatus(commitlog_pb2.GetStoreStatusRequest(), timeout=10)
    return status.max_offset - status.min_offset + _disk_bytes(broker.store_dir, skip=broker.store_dir / "commitlog") + _disk_bytes(broker.index_dir)


def _through_router(root: Path, keys_per_file: int, queries: int, echo: EchoCeiling) -> tuple[list[Result], dict[str, list[tuple[float, float, float]]]]:
    out: list[Result] = []
    curves: dict[str, list[tuple[float, float, float]]] = {}
    # Keys only (no unique keys): one index entry per message, so a file holds keys_per_file messages.
    cluster = LocalCluster(root=root / "cluster", indexer_args=["--index-num", str(keys_per_file + 1), "--hash-slots", str(max(1, keys_per_file // 4))])
    try:
        cluster.start_router()
        for i in range(6):
            cluster.add_broker(f"broker-{i + 1}", HOSTS[i])
        assert cluster.router is not None
        b1 = cluster.brokers["broker-1"]
        ix_pid = b1.indexer.proc.pid  # type: ignore[union-attr]
        cl_pid = b1.commitlog.proc.pid  # type: ignore[union-attr]
        b4 = cluster.brokers[f"broker-{len(FILE_COUNTS)}"]
        before = {"indexer": _rss_kib(b4.indexer.proc.pid), "commitlog": _rss_kib(b4.commitlog.proc.pid)}  # type: ignore[union-attr]
        empty_ix = _rss_kib(ix_pid)  # broker-1's indexer with an empty index
        # Files per broker: broker-i keeps FILE_COUNTS[i] files of its own topic, so every file
        # count is asked in the same rounds (see _interleaved).
        cases: dict[tuple[int, str], tuple[str, list[str]]] = {}
        for i, files in enumerate(FILE_COUNTS):
            b = cluster.brokers[f"broker-{i + 1}"]
            topic = f"GrowthFiles{files}"
            newest = _send(b.commitlog.address, topic, 0, files * keys_per_file)[-keys_per_file:]
            cases[(files, "key in newest file")] = (topic, newest)
            cases[(files, "absent key")] = (topic, _absent(1000))
        cluster.wait_indexed(timeout_s=900)
        for b in cluster.brokers.values():  # the key filters are built in the background: wait for them
            with open_channel(b.indexer.address) as ich:
                ist, deadline = indexer_pb2_grpc.IndexerServiceStub(ich), time.monotonic() + 300
                while ist.GetIndexStatus(indexer_pb2.GetIndexStatusRequest(), timeout=10).key_filter_pending_files:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{b.name}: key filters not built within 300 s")
                    threading.Event().wait(0.1)
        one_file_ix = _rss_kib(ix_pid)  # the same indexer holding one small file (FILE_COUNTS[0] == 1)
        # Store size: what each file-count broker keeps (log, queues, IndexFiles), so the same
        # latencies are also drawn against the size of the store.
        store_mib = {files: _store_bytes(cluster.brokers[f"broker-{i + 1}"]) / 2**20 for i, files in enumerate(FILE_COUNTS)}
        big = cluster.brokers[f"broker-{len(FILE_COUNTS)}"]
        after = {"indexer": _rss_kib(big.indexer.proc.pid), "commitlog": _rss_kib(big.commitlog.proc.pid)}  # type: ignore[union-attr]
        sent = FILE_COUNTS[-1] * keys_per_file
        stats = _interleaved(cluster.router.address, cases, queries)
        for (files, label), s in stats.items():
            topic, keys = cases[(files, label)]
            probe = router_pb2.QueryMsgByKeyRequest(topic=topic, key=keys[0])
            with grpc.insecure_channel(cluster.router.address) as ch:
                resp = router_pb2_grpc.QueryRouterServiceStub(ch).QueryMsgByKey(probe, timeout=10)
            c = echo.measure(probe.ByteSize(), resp.ByteSize(), 1, min(queries, 500))
            params = {"index_files": files, "brokers": 1, "keys_per_file": keys_per_file, "concurrency": 1}
            out += [Result(f"key query p50 vs IndexFiles, {label}", s.p50_ms, "ms", params),
                    Result(f"key query p99 vs IndexFiles, {label}", s.p99_ms, "ms", params),
                    Result(f"key query / ceiling vs IndexFiles, {label}", s.rate / c.rate, "x", params)]
            curves.setdefault(f"files: {label}", []).append((files, s.p50_ms, c.p50_ms))
            curves.setdefault(f"size: {label}", []).append((store_mib[files], s.p50_ms, c.p50_ms))
        for files, mib in store_mib.items():
            out.append(Result("store size (log records, queues, IndexFiles)", mib, "MiB",
                              {"index_files": files, "messages": files * keys_per_file, "keys_per_file": keys_per_file}))
        # Memory: broker-4's services before any message and after its 256 files' keys.
        for svc in ("indexer", "commitlog"):
            for k in ("RssAnon", "RssFile"):
                out.append(Result(f"{svc} {k} per million indexed keys", (after[svc][k] - before[svc][k]) / 1024 / (sent / 1e6), "MiB",
                                  {"keys": sent, "keys_per_file": keys_per_file}))
        # Absolute sizes: an indexer process with nothing indexed, with one small file, with 256.
        for label, rss in (("empty index", empty_ix), ("1 file", one_file_ix), (f"{FILE_COUNTS[-1]} files", after["indexer"])):
            out.append(Result(f"indexer RSS, {label}", rss["VmRSS"] / 1024, "MiB",
                              {"RssAnon_MiB": round(rss["RssAnon"] / 1024, 1), "keys_per_file": keys_per_file}))
        # Brokers holding the topic: 10 files' worth of keys on each.
        for n in BROKER_COUNTS:
            topic = f"GrowthBrokers{n}"
            threads, newest_keys = [], []
            for i in range(n):
                def load(b=cluster.brokers[f"broker-{i + 1}"]) -> None:  # type: ignore[no-untyped-def]
                    newest_keys.extend(_send(b.commitlog.address, topic, 0, keys_per_file)[-100:])
                threads.append(threading.Thread(target=load))
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            cluster.wait_indexed(timeout_s=600)
            deadline = time.monotonic() + 30  # the topic's route reaches the router with the next heartbeat
            with grpc.insecure_channel(cluster.router.address) as ch:
                rs = router_pb2_grpc.QueryRouterServiceStub(ch)
                while len(rs.GetTopicRoute(router_pb2.GetTopicRouteRequest(topic=topic), timeout=10).brokers) < n and time.monotonic() < deadline:
                    time.sleep(0.1)
            for label, keys in (("key present", newest_keys), ("absent key", _absent(1000))):
                s, req, resp = _query_stats(cluster.router.address, topic, keys, queries)
                c = echo.measure(req, resp, 1, queries)
                params = {"brokers": n, "concurrency": 1}
                out += [Result(f"key query p50 vs brokers, {label}", s.p50_ms, "ms", params),
                        Result(f"key query p99 vs brokers, {label}", s.p99_ms, "ms", params),
                        Result(f"key query / ceiling vs brokers, {label}", s.rate / c.rate, "x", params)]
                curves.setdefault(f"brokers: {label}", []).append((n, s.p50_ms, c.p50_ms))
        # A thousand topics: one message each on broker-1.
        pids = {"router": cluster.router.proc.pid, "commitlog": cl_pid, "indexer": ix_pid}  # type: ignore[union-attr]
        before_t = {k: _rss_kib(p)["RssAnon"] for k, p in pids.items()}
        with open_channel(b1.commitlog.address) as ch:
            stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
            for t in range(1000):
                stub.SendMessage(commitlog_pb2.SendMessageRequest(message=common_pb2.MessageInput(topic=f"GrowthTopic{t}", body=b"x", keys=["k"], queue_id=-1)), timeout=10)
        cluster.wait_indexed(timeout_s=600)
        time.sleep(2)  # one heartbeat carries the new topics to the router (measured, not synchronised on)
        for k, p in pids.items():
            out.append(Result(f"{k} RssAnon per thousand topics", (_rss_kib(p)["RssAnon"] - before_t[k]) / 1024, "MiB", {"topics": 1000}))
    finally:
        cluster.stop()
    return out, curves


def _charts(store: list[Result], curves: dict[str, list[tuple[float, float, float]]]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(20, 4.2))
    ax = axes[0]
    for label in ("key in newest file", "absent key"):
        pts = [(r.params["index_files"], r.value) for r in store if label in r.metric]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    ax.set(xscale="log", xlabel="IndexFiles", ylabel="µs (p50)", title="store query_page vs IndexFiles", ylim=(0, None))
    ax.legend()
    for ax, dim, xlabel in ((axes[1], "files", "IndexFiles per broker"), (axes[2], "size", "store size, MiB"),
                            (axes[3], "brokers", "brokers holding the topic")):
        ceiling_drawn = False
        for name, pts in curves.items():
            if not name.startswith(dim):
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name.split(": ", 1)[1])
            if not ceiling_drawn:
                ax.plot([p[0] for p in pts], [p[2] for p in pts], linestyle="--", color="grey", label="echo ceiling p50")
                ceiling_drawn = True
        ax.set(xlabel=xlabel, ylabel="ms (p50, through the router)", title=f"key query vs {xlabel}", ylim=(0, None))
        if dim in ("files", "size"):
            ax.set_xscale("log")
        ax.legend()
    fig.tight_layout()
    fig.savefig(BENCH_DIR / "growth_key_query.png", dpi=90)
    plt.close(fig)


def run(argv: list[str]) -> list[Result]:
    p = argparse.ArgumentParser(prog="python -m bench growth")
    p.add_argument("--keys-per-file", type=int, default=2000, help="entries per IndexFile (small files, so 256 of them fill quickly)")
    p.add_argument("--queries", type=int, default=1000, help="queries per case (rounds of the interleaved runs)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="quarry-bench-") as tmp, EchoCeiling() as echo:
        store = _store_level(Path(tmp), args.keys_per_file, args.queries * 2)
        routed, curves = _through_router(Path(tmp), args.keys_per_file, args.queries, echo)
    out = store + routed
    for label in ("key in newest file", "absent key"):
        by = {r.params["index_files"]: r.value for r in out if r.metric == f"key query p50 vs IndexFiles, {label}"}
        out.append(Result(f"key query p50 256 files / 1 file, {label}", by[256] / by[1], "x", {"target": "<= 1.2"}))
        sb = {r.params["index_files"]: r.value for r in store if label in r.metric}
        out.append(Result(f"store query_page p50 256 files / 1 file, {label}", sb[256] / sb[1], "x", {}))
    _charts(store, curves)
    return out
