"""Quarry against Apache RocketMQ's own broker on the same machine, in one run (issue 36, part 3):
the same Java client, the same messages, both servers up side by side.

- Sends: `quarry.bench.Bench4` (RocketMQ 4.9.8's `DefaultMQProducer`, sync sends of 1 KiB bodies
  with the benchmark Producer's key, no compression; bench java_clients) at 1, 16 and 64 threads,
  against RocketMQ 4.9.7's NameServer + broker (tests/e2e/rocketmq_broker.py, `make
  rocketmq-broker`) and against a Quarry cluster (router + one broker: commitlog and indexer;
  namesrvAddr: the router's remoting port). Rate, p50, p99 and Quarry / RocketMQ. Each thread
  count sends to RocketMQ then to Quarry, then (round 2, when --rounds 2) Quarry then RocketMQ;
  medians of the rounds.
  Each server's CPU per message stored over each JVM's life (warm-up sends included).
- Queries: `quarry.bench.Query4` through `DefaultMQAdminExt` (queryMessage by key,
  queryMessageByUniqKey, viewMessage by offsetMsgId), a key present and a key absent, one at a
  time, against both; one IndexFile on the broker (RocketMQ's default 20M entries a file: every
  message of the run fits in its first). Then (--index-files, default 256) the same queries
  against a fresh pair whose IndexFiles hold 1,000 entries each (both: maxIndexNum /
  --index-num, a slot per 4 entries), filled by the same sends until each holds 256 IndexFiles;
  each server's p50 there over its own with one IndexFile.
- Memory: VmRSS (and its anonymous and file parts) of the broker JVM and the NameServer JVM
  against Quarry's router, commitlog and indexer after the sends, and per million messages sent.
- Recovery (--recovery-mib, default 1024): a fresh pair, each filled with 1 GiB of log (4 KiB
  bodies), killed with SIGKILL and started again; seconds from the spawn to the first answer of
  its remoting port and to every message being back.

The broker runs with RocketMQ's own defaults for its files (1 GiB CommitLog files, 20M-entry
IndexFiles, ASYNC_FLUSH, ASYNC_MASTER) and a 1 GiB G1 heap, full JIT (RocketMQ's scripts give it
8 GB; this machine is shared); Quarry's commitlog with 512 MiB segments and flush mode ASYNC.

`.venv/bin/python -m bench rocketmq [--messages N] [--rounds N] [--queries N] [--threads 1,16,64]
[--index-files N] [--recovery-mib N]` (after `make java-clients rocketmq-broker`)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from bench.ceiling import Stats, median_run, pct
from bench.java_clients import JVM_FLAGS as CLIENT_JVM_FLAGS, java_send
from bench.runner import Result, process_cpu_s
from scripts.launcher import LocalCluster
from tests.e2e import java
from tests.e2e.rocketmq_broker import RocketMQ, classpath as broker_classpath, java_binary

SMALL_INDEX_ENTRIES = 1000  # entries an IndexFile holds in the many-IndexFiles case (500 messages), so that 256 form quickly
TOPIC = "BenchJavaClients"  # bench.java_clients.java_send's topic
BODY_BYTES = 1024
THREADS = (1, 16, 64)
KINDS = {"key": "key present (queryMessage)", "key_absent": "key absent (queryMessage)",
         "uniq": "unique key present (queryMessageByUniqKey)", "uniq_absent": "unique key absent (queryMessageByUniqKey)",
         "id": "by id (viewMessage(offsetMsgId))"}

# The broker's JVM for a benchmark: RocketMQ's runbroker.sh uses G1 and the full JIT (the e2e
# harness's C1-only small heap is for quick starts); the heap 1 GiB, not its 8 GB.
BROKER_JVM_FLAGS = [
    "-Xms1g", "-Xmx1g", "-XX:+UseG1GC", "-XX:G1HeapRegionSize=16m", "-XX:MaxDirectMemorySize=1g", "-XX:-OmitStackTraceInFastThrow",
    "--add-opens=java.base/java.nio=ALL-UNNAMED", "--add-opens=java.base/jdk.internal.ref=ALL-UNNAMED",
    "-Djava.net.preferIPv4Stack=true",
]
# RocketMQ 4.9.7's defaults for what the e2e harness shrinks (its files roll every MiB there).
BROKER_DEFAULTS: dict[str, object] = {
    "mappedFileSizeCommitLog": 1 << 30, "mappedFileSizeConsumeQueue": 300000 * 20, "maxHashSlotNum": 5000000,
    "maxIndexNum": 5000000 * 4, "flushIntervalCommitLog": 500, "flushIntervalConsumeQueue": 1000,
    "cleanResourceInterval": 10000, "waitTimeMillsInSendQueue": 200, "osPageCacheBusyTimeOutMills": 1000,
    "deleteCommitLogFilesInterval": 100, "deleteConsumeQueueFilesInterval": 100,
}


class BenchRocketMQ(RocketMQ):
    """tests/e2e's RocketMQ with the benchmark's JVM flags."""

    def _java(self, main: str, args: list[str], log: Path) -> "subprocess.Popen[bytes]":
        flags = BROKER_JVM_FLAGS if main.endswith("BrokerStartup") else ["-Xms64m", "-Xmx256m", "-XX:+UseSerialGC", *BROKER_JVM_FLAGS[4:]]
        cmd = [java_binary(), *flags, f"-Duser.home={self.root}", f"-Drocketmq.home.dir={self.home}",
               f"-Drocketmq.client.logRoot={self.logs}", "-cp", broker_classpath(self.version), main, *args]
        env = {k: v for k, v in os.environ.items() if k != "NAMESRV_ADDR"}
        env["ROCKETMQ_HOME"] = str(self.home)
        with open(log, "ab") as out:
            return subprocess.Popen(cmd, cwd=self.root, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def memory(pid: int) -> dict[str, float]:
    """VmRSS, RssAnon, RssFile of process `pid`, MiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
            out[name] = int(rest.split()[0]) / 1024
    return out


def stored_messages(broker: str, topic: str = TOPIC, queues: int = 32) -> int:
    """Messages of `topic` held by the broker at remoting address `broker`: the sum of its queues'
    max offsets (GET_MAX_OFFSET; a queue that does not exist answers 0 on both servers)."""
    import asyncio

    from quarry.services.remoting import codes
    from tests.remoting_client import RemotingClient

    async def ask() -> int:
        async with RemotingClient(broker) as client:
            total = 0
            for q in range(queues):
                answer = await client.call(codes.GET_MAX_OFFSET, {"topic": topic, "queueId": q}, timeout_s=10)
                if answer.code == codes.SUCCESS:
                    total += int(answer.ext_fields.get("offset", "0"))
            return total
    return asyncio.run(ask())


def query_run(namesrv: str, seed: int, queries: int, work: Path) -> dict[str, object]:
    work.mkdir(parents=True, exist_ok=True)
    cmd = [java.java_binary(), *CLIENT_JVM_FLAGS, f"-Drocketmq.client.logRoot={work / 'logs'}", "-Drocketmq.client.logLevel=WARN",
           f"-Duser.home={work}", "-cp", java.classpath("rmq4"), "quarry.bench.Query4",
           namesrv, TOPIC, str(seed), str(queries), "50", "3000", str(BODY_BYTES)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=work)
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    if run.returncode != 0 or not lines:
        raise RuntimeError(f"Query4 exited {run.returncode}: {run.stdout[-2000:]} {run.stderr[-3000:]}")
    answer: dict[str, object] = json.loads(lines[-1])
    answer["stderr"] = run.stderr[-1500:]
    return answer


def fill(namesrv: str, messages: int, body_bytes: int, work: Path) -> None:
    """`messages` sync sends by Bench4 at 16 threads, no warm-up (what the measured cases send, to fill a store)."""
    from bench.java_clients import _jvm

    run = _jvm("quarry.bench.Bench4", [namesrv, TOPIC, "16", str(messages), "0", str(body_bytes)], "rmq4", work, 900)
    if run.returncode != 0:
        raise RuntimeError(f"Bench4 exited {run.returncode}: {run.stdout[-2000:]} {run.stderr[-3000:]}")


def index_files_held(rmq: RocketMQ, cluster: LocalCluster) -> dict[str, int]:
    """IndexFiles each server holds: the broker's store/index directory, the indexer's own count."""
    from quarry.channels import open_channel
    from quarry.formats.index_keys import INDEX_FILE_NAME
    from quarry.v1 import indexer_pb2, indexer_pb2_grpc

    with open_channel(cluster.brokers["broker-a"].indexer.address) as ch:
        status = indexer_pb2_grpc.IndexerServiceStub(ch).GetIndexStatus(indexer_pb2.GetIndexStatusRequest(), timeout=10)
    return {"rocketmq": sum(1 for f in (rmq.store / "index").glob("*") if INDEX_FILE_NAME.match(f.name)), "quarry": len(status.files),
            "quarry_filters_pending": status.key_filter_pending_files}


def many_index_files(root: Path, files: int, args: argparse.Namespace) -> tuple[dict[str, dict[str, object]], dict[str, int]]:
    """The queries against fresh servers whose IndexFiles hold SMALL_INDEX_ENTRIES entries each
    (both: RocketMQ's maxIndexNum and maxHashSlotNum, the indexer's --index-num and --hash-slots,
    in RocketMQ's default ratio of 4 entries a slot), each filled by the same sends (Bench4, 16
    threads) until it holds `files` IndexFiles. What each held when the queries began is returned."""
    namesrv_port, broker_port = _free_ports()
    small = {"maxIndexNum": SMALL_INDEX_ENTRIES, "maxHashSlotNum": SMALL_INDEX_ENTRIES // 4}
    rmq = BenchRocketMQ(root / "rocketmq-idx", host="127.0.0.185", settings={**BROKER_DEFAULTS, **small},
                        namesrv_port=namesrv_port, broker_port=broker_port)
    cluster = LocalCluster(root=root / "quarry-idx", commitlog_args=["--segment-size", str(512 << 20)],
                           indexer_args=["--index-num", str(SMALL_INDEX_ENTRIES), "--hash-slots", str(SMALL_INDEX_ENTRIES // 4), "--max-files", "0"])
    queries: dict[str, dict[str, object]] = {}
    try:
        rmq.start(timeout_s=120)
        cluster.start_router(host="127.0.0.186")
        cluster.add_broker("broker-a", "127.0.0.187")
        assert cluster.router is not None
        targets = {"rocketmq": rmq.namesrv_addr, "quarry": cluster.router.remoting_address}
        for server in ("rocketmq", "quarry"):
            for chunk in range(64):
                cluster.wait_indexed(timeout_s=300)
                holds = index_files_held(rmq, cluster)[server]
                if holds >= files:
                    break
                # A message enters two entries (its key and its unique key).
                want = (files - holds) * (SMALL_INDEX_ENTRIES - 1) // 2
                fill(targets[server], max(500, min(want, 40000)), BODY_BYTES, root / f"fill-{server}-{chunk}")
            print(f"{files} IndexFiles: {server} filled", flush=True)
        pause, deadline = threading.Event(), time.monotonic() + 120
        while index_files_held(rmq, cluster)["quarry_filters_pending"] and time.monotonic() < deadline:
            pause.wait(0.2)  # the indexer's key filters of sealed files, built in the background at its own pace
        held = index_files_held(rmq, cluster)
        for server in ("rocketmq", "quarry"):
            try:
                queries[server] = query_run(targets[server], args.seed, args.queries, root / f"query-idx-{server}")
                print(f"queries at {files} IndexFiles {server}: wrong {queries[server]['wrong']}", flush=True)
            except Exception as exc:  # noqa: BLE001 - a failed query run is reported
                queries[server] = {"error": str(exc)[-1500:]}
                print(f"queries at {files} IndexFiles {server} failed: {exc}", flush=True)
        after = index_files_held(rmq, cluster)
        held.update({f"{k}_after_queries": v for k, v in after.items() if not k.endswith("pending")})
    finally:
        cluster.stop()
        rmq.stop()
    return queries, held


RECOVERY_BODY_BYTES = 4096  # the recovery case's bodies: 1 GiB in ~250k messages, sent in a minute or two


def recovery(root: Path, mib: int, rounds: int) -> dict[str, dict[str, object]]:
    """Each server (fresh; the broker with RocketMQ's 1 GiB CommitLog files, the commitlog with
    512 MiB segments) filled by Bench4 (16 threads, 4 KiB bodies) until its log holds `mib` MiB,
    then, `rounds` times, the servers in alternating order, killed with SIGKILL and started again:
    seconds from the spawn until its remoting port first answers GET_MAX_OFFSET, and until the
    topic's queues hold every message they held before (the medians, and each round's)."""
    namesrv_port, broker_port = _free_ports()
    rmq = BenchRocketMQ(root / "rocketmq-rec", host="127.0.0.185", settings=dict(BROKER_DEFAULTS), namesrv_port=namesrv_port, broker_port=broker_port)
    cluster = LocalCluster(root=root / "quarry-rec", commitlog_args=["--segment-size", str(512 << 20)])
    out: dict[str, dict[str, object]] = {}
    try:
        rmq.start(timeout_s=120)
        cluster.start_router(host="127.0.0.186")
        b = cluster.add_broker("broker-a", "127.0.0.187")
        assert cluster.router is not None
        targets = {"rocketmq": rmq.namesrv_addr, "quarry": cluster.router.remoting_address}
        brokers = {"rocketmq": rmq.broker_addr, "quarry": b.commitlog.remoting_address}
        logs = {"rocketmq": rmq.store / "commitlog", "quarry": b.store_dir / "commitlog"}
        held: dict[str, int] = {}
        for server in ("rocketmq", "quarry"):
            for chunk in range(32):
                if _du(logs[server]) >= mib << 20:
                    break
                want = max(2000, ((mib << 20) - _du(logs[server])) // (RECOVERY_BODY_BYTES + 200) + 1)
                fill(targets[server], min(want, 120000), RECOVERY_BODY_BYTES, root / f"rec-fill-{server}-{chunk}")
            held[server] = stored_messages(brokers[server])
            out[server] = {"messages": held[server], "log_mib": _du(logs[server]) / 2**20, "first_answer_s": [], "all_messages_s": []}
        pause = threading.Event()
        for r in range(rounds):
            for server in (("rocketmq", "quarry") if r % 2 == 0 else ("quarry", "rocketmq")):
                starting = None
                if server == "rocketmq":
                    rmq.kill_broker()
                    t0 = time.monotonic()
                    rmq.starts += 1
                    rmq.broker = rmq._java("org.apache.rocketmq.broker.BrokerStartup", ["-c", str(rmq.root / "broker.conf")], rmq.logs / f"broker-{rmq.starts}.out")
                else:
                    b.commitlog.kill()
                    t0 = time.monotonic()
                    starting = threading.Thread(target=b.commitlog.start, kwargs={"wait_s": 900}, daemon=True)
                    starting.start()
                first = every = 0.0
                while time.monotonic() - t0 < 900:
                    try:
                        now_held = stored_messages(brokers[server])
                    except (OSError, EOFError, TimeoutError):  # (not listening yet, or closed while starting)
                        now_held = -1
                    if now_held >= 0 and not first:
                        first = time.monotonic() - t0
                    if now_held >= held[server]:
                        every = time.monotonic() - t0
                        break
                    pause.wait(0.02)
                if starting is not None:
                    starting.join(120)  # (its health says SERVING too, before it is killed again)
                out[server]["first_answer_s"].append(round(first, 3))  # type: ignore[attr-defined]
                out[server]["all_messages_s"].append(round(every, 3))  # type: ignore[attr-defined]
                print(f"recovery round {r} {server}: first answer {first:.2f} s, every message {every:.2f} s", flush=True)
    finally:
        cluster.stop()
        rmq.stop()
    return out


def query_rows(queries: dict[str, dict[str, object]], qparams: dict[str, object], where: str) -> list[Result]:
    """p50, p99 of each kind on each server, and Quarry / RocketMQ; `where` names the index's size."""
    results: list[Result] = []
    if len(queries) == 2 and all("latMs" in q for q in queries.values()):
        for kind, label in KINDS.items():
            figs = {}
            for server, name in (("rocketmq", "RocketMQ 4.9.7 broker"), ("quarry", "Quarry")):
                lat = queries[server]["latMs"][kind]  # type: ignore[index]
                wrong = queries[server]["wrong"][kind]  # type: ignore[index]
                figs[server] = (pct(lat, 0.5), pct(lat, 0.99))
                at = {**qparams, "wrong_answers": wrong}
                results += [Result(f"query {label}{where}, {name}, p50", figs[server][0], "ms", at),
                            Result(f"query {label}{where}, {name}, p99", figs[server][1], "ms", at)]
            results += [Result(f"query {label}{where}, Quarry / RocketMQ: p50", figs["quarry"][0] / figs["rocketmq"][0], "x", qparams),
                        Result(f"query {label}{where}, Quarry / RocketMQ: p99", figs["quarry"][1] / figs["rocketmq"][1], "x", qparams)]
    else:
        for server, q in queries.items():
            if "error" in q:
                results.append(Result(f"query run failed{where}, {server}: {str(q['error'])[:300]}", 0, "-", qparams))
    return results


def run(argv: list[str]) -> list[Result]:
    p = argparse.ArgumentParser(prog="bench rocketmq")
    p.add_argument("--messages", type=int, default=10000, help="sends at each thread count in one round, each server")
    p.add_argument("--rounds", type=int, default=2, help="rounds (the order of the servers alternates; medians)")
    p.add_argument("--queries", type=int, default=300, help="queries of each kind, each server (0: none)")
    p.add_argument("--seed", type=int, default=2000, help="messages with keys of their own the queries ask for")
    p.add_argument("--index-files", type=int, default=256,
                   help="then the queries again on fresh servers filled until each holds this many IndexFiles (<= 1: not run)")
    p.add_argument("--recovery-mib", type=int, default=1024,
                   help="then each server on its own filled with this many MiB of log, killed (SIGKILL) and timed back to serving (0: not run)")
    p.add_argument("--recovery-rounds", type=int, default=3, help="kills and starts of each server, alternating (medians)")
    p.add_argument("--threads", type=lambda v: tuple(int(t) for t in v.split(",")), default=THREADS,
                   help="sender thread counts, comma-separated (default 1,16,64)")
    args = p.parse_args(argv)
    n, rounds = args.messages, max(1, args.rounds)
    params: dict[str, object] = {"body_bytes": BODY_BYTES, "messages": n, "rounds": rounds, "keys": "on",
                                 "client": "RocketMQ 4.9.8 DefaultMQProducer (Bench4)", "server": "RocketMQ 4.9.7 broker / Quarry router+commitlog+indexer"}
    load_before = os.getloadavg()[0]
    runs: dict[tuple[str, int], list[Stats]] = {}
    queries: dict[str, dict[str, object]] = {}
    mem: dict[str, dict[str, float]] = {}
    sent = {"rocketmq": 0, "quarry": 0}
    cores: dict[tuple[str, int], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-rocketmq-") as tmp:
        root = Path(tmp)
        namesrv_port, broker_port = _free_ports()
        rmq = BenchRocketMQ(root / "rocketmq", host="127.0.0.181", settings=dict(BROKER_DEFAULTS),
                            namesrv_port=namesrv_port, broker_port=broker_port)
        cluster = LocalCluster(root=root / "quarry", commitlog_args=["--segment-size", str(512 << 20)])
        try:
            rmq.start(timeout_s=120)
            cluster.start_router(host="127.0.0.183")
            cluster.add_broker("broker-a", "127.0.0.184")
            assert cluster.router is not None
            targets = {"rocketmq": rmq.namesrv_addr, "quarry": cluster.router.remoting_address}
            b = cluster.brokers["broker-a"]
            brokers = {"rocketmq": rmq.broker_addr, "quarry": b.commitlog.remoting_address}
            assert rmq.broker is not None and rmq.namesrv is not None
            pids = {"rocketmq broker JVM": rmq.broker.pid, "quarry router": cluster.router.proc.pid,  # type: ignore[union-attr]
                    "quarry commitlog": b.commitlog.proc.pid, "quarry indexer": b.indexer.proc.pid}  # type: ignore[union-attr]
            mem_start = {k: memory(pid) for k, pid in pids.items()}
            mem_start["rocketmq NameServer JVM"] = memory(rmq.namesrv.pid)
            for r in range(rounds):
                for threads in args.threads:
                    order = ("rocketmq", "quarry") if r % 2 == 0 else ("quarry", "rocketmq")
                    for server in order:
                        held0 = stored_messages(brokers[server])
                        cpu0, t0 = {k: process_cpu_s(pid) for k, pid in pids.items()}, time.monotonic()
                        s = java_send("rmq4", targets[server], threads, n, root / f"send-{server}-{r}-{threads}")
                        wall = time.monotonic() - t0
                        used = {k: process_cpu_s(pid) - cpu0[k] for k, pid in pids.items() if k.startswith(server)}
                        took = stored_messages(brokers[server]) - held0  # the measured sends and the JVM's warm-up sends
                        # Cores each server process used over the JVM's life (its 5 s warm-up and the measured
                        # sends), and its CPU per message stored meanwhile: less swayed by a loaded machine than rates.
                        cores.setdefault((server, threads), []).append(
                            {**{k: round(v / wall, 2) for k, v in used.items()},
                             **{f"{k} us/msg": round(v / max(took, 1) * 1e6, 1) for k, v in used.items()}})
                        runs.setdefault((server, threads), []).append(s)
                        sent[server] += n  # plus each JVM's 5 s of warm-up sends, not counted here
                        print(f"round {r} {server} {threads} threads: {s.rate:,.0f} msg/s p50 {s.p50_ms:.2f} p99 {s.p99_ms:.2f}", flush=True)
            # Memory after the sends (before the queries' seed messages).
            mem["rocketmq broker JVM"] = memory(rmq.broker.pid)
            mem["rocketmq NameServer JVM"] = memory(rmq.namesrv.pid)
            for label, proc in (("quarry router", cluster.router.proc), ("quarry commitlog", b.commitlog.proc), ("quarry indexer", b.indexer.proc)):
                assert proc is not None
                mem[label] = memory(proc.pid)
            stored = {"rocketmq": _du(rmq.store / "commitlog"), "quarry": _du(b.store_dir)}
            index_files = len(list((rmq.store / "index").glob("*")))
            if args.queries > 0:
                for server in ("rocketmq", "quarry"):
                    try:
                        queries[server] = query_run(targets[server], args.seed, args.queries, root / f"query-{server}")
                        print(f"queries {server}: wrong {queries[server]['wrong']}", flush=True)
                    except Exception as exc:  # noqa: BLE001 - a failed query run is reported, the sends kept
                        queries[server] = {"error": str(exc)[-1500:]}
                        print(f"queries {server} failed: {exc}", flush=True)
        finally:
            cluster.stop()
            rmq.stop()
        many: dict[str, dict[str, object]] = {}
        held: dict[str, int] = {}
        if args.index_files > 1 and args.queries > 0:
            many, held = many_index_files(root, args.index_files, args)
        recovered = recovery(root, args.recovery_mib, args.recovery_rounds) if args.recovery_mib > 0 else {}
    params["loadavg_1m"] = f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after"
    results: list[Result] = []
    for threads in args.threads:
        at = {**params, "threads": threads}
        med = {s: median_run(runs[(s, threads)]) for s in ("rocketmq", "quarry")}
        for server, label in (("rocketmq", "RocketMQ 4.9.7 broker"), ("quarry", "Quarry")):
            s = med[server]
            base = f"sends, {label}, {threads} thread{'s' if threads > 1 else ''}"
            results += [Result(base, s.rate, "msg/s", {**at, "round_rates": [round(x.rate) for x in runs[(server, threads)]],
                                                       "server_cores_per_round": cores[(server, threads)]}),
                        Result(f"{base}, p50", s.p50_ms, "ms", at), Result(f"{base}, p99", s.p99_ms, "ms", at)]
        base = f"sends, Quarry / RocketMQ, {threads} thread{'s' if threads > 1 else ''}"
        results += [Result(f"{base}: rate", med["quarry"].rate / med["rocketmq"].rate, "x", at),
                    Result(f"{base}: p50", med["quarry"].p50_ms / med["rocketmq"].p50_ms, "x", at),
                    Result(f"{base}: p99", med["quarry"].p99_ms / med["rocketmq"].p99_ms, "x", at)]
    qparams = {"seed_messages": args.seed, "queries": args.queries, "concurrency": 1, "rocketmq_index_files": index_files,
               "messages_before": f"rocketmq {sent['rocketmq']:,}, quarry {sent['quarry']:,} (+ warm-up sends)"}
    results += query_rows(queries, qparams, "")
    if many:
        where = f", {args.index_files} IndexFiles"
        results += query_rows(many, {"seed_messages": args.seed, "queries": args.queries, "concurrency": 1, "index_file_entries": SMALL_INDEX_ENTRIES,
                                     "index_files_held": held}, where)
        for kind, label in KINDS.items():  # growth: each server's p50 at many IndexFiles over its own at one
            for server, name in (("rocketmq", "RocketMQ 4.9.7 broker"), ("quarry", "Quarry")):
                one, lots = queries.get(server, {}).get("latMs"), many.get(server, {}).get("latMs")
                if one and lots:
                    results.append(Result(f"query {label}, {name}: p50{where} / p50 at 1", pct(lots[kind], 0.5) / pct(one[kind], 0.5), "x",  # type: ignore[index]
                                          {"index_files_held": held}))
    if recovered:
        rparams = {"body_bytes": RECOVERY_BODY_BYTES, "sender": "Bench4, 16 threads", "kill": "SIGKILL", "probe": "GET_MAX_OFFSET of every queue, every 20 ms",
                   "log_mib": {k: round(float(v["log_mib"])) for k, v in recovered.items()},  # type: ignore[arg-type]
                   "messages": {k: v["messages"] for k, v in recovered.items()}, "rounds": args.recovery_rounds}
        for field_, what in (("first_answer_s", "first answer"), ("all_messages_s", "every message back")):
            mid = {k: float(statistics.median(v[field_])) for k, v in recovered.items()}  # type: ignore[arg-type]
            for server, name in (("rocketmq", "RocketMQ 4.9.7 broker"), ("quarry", "Quarry commitlog")):
                results.append(Result(f"recovery after SIGKILL with {args.recovery_mib} MiB in the log, {name}: start to {what} (median)", mid[server], "s",
                                      {**rparams, "each_round_s": recovered[server][field_]}))
            if mid["rocketmq"]:
                results.append(Result(f"recovery after SIGKILL, start to {what}: Quarry / RocketMQ", mid["quarry"] / mid["rocketmq"], "x", rparams))
    stored_msgs = {k: int(q.get("storedBefore", -1)) for k, q in queries.items()}  # type: ignore[call-overload]
    per = {k: (stored_msgs.get(k, -1) if stored_msgs.get(k, -1) > 0 else sent[k]) for k in ("rocketmq", "quarry")}
    mparams = {"messages_sent": f"{sent['rocketmq']:,} measured + each JVM's 5 s of warm-up sends, each server",
               "messages_stored": f"rocketmq {per['rocketmq']:,}, quarry {per['quarry']:,} (topic stats; what per million divides by)",
               "stored_bytes": f"rocketmq commitlog {stored['rocketmq'] / 2**20:.0f} MiB, quarry store {stored['quarry'] / 2**20:.0f} MiB",
               "broker_heap": "-Xms1g -Xmx1g G1"}
    for label, m in mem.items():
        results += [Result(f"memory after the sends, {label}: VmRSS", m["VmRSS"], "MiB", {**mparams, "RssAnon_MiB": round(m.get("RssAnon", 0), 1),
                                                                                         "RssFile_MiB": round(m.get("RssFile", 0), 1),
                                                                                         "VmRSS_at_start_MiB": round(mem_start[label]["VmRSS"], 1)})]
    r_rss = mem["rocketmq broker JVM"]["VmRSS"] + mem["rocketmq NameServer JVM"]["VmRSS"]
    q_rss = sum(m["VmRSS"] for k, m in mem.items() if k.startswith("quarry"))
    r_anon = mem["rocketmq broker JVM"].get("RssAnon", 0) + mem["rocketmq NameServer JVM"].get("RssAnon", 0)
    q_anon = sum(m.get("RssAnon", 0) for k, m in mem.items() if k.startswith("quarry"))
    r_grow = r_rss - mem_start["rocketmq broker JVM"]["VmRSS"] - mem_start["rocketmq NameServer JVM"]["VmRSS"]
    q_grow = q_rss - sum(m["VmRSS"] for k, m in mem_start.items() if k.startswith("quarry"))
    results += [Result("memory growth over the sends per million messages stored, RocketMQ (broker + NameServer): VmRSS", r_grow / (per["rocketmq"] / 1e6), "MiB", mparams),
                Result("memory growth over the sends per million messages stored, Quarry (router + commitlog + indexer): VmRSS", q_grow / (per["quarry"] / 1e6), "MiB", mparams)]
    results += [Result("memory after the sends, RocketMQ (broker + NameServer): VmRSS", r_rss, "MiB", {**mparams, "RssAnon_MiB": round(r_anon, 1)}),
                Result("memory after the sends, Quarry (router + commitlog + indexer): VmRSS", q_rss, "MiB", {**mparams, "RssAnon_MiB": round(q_anon, 1)}),
                Result("memory, Quarry / RocketMQ: VmRSS", q_rss / r_rss, "x", mparams),
                Result("memory, Quarry / RocketMQ: RssAnon", q_anon / r_anon, "x", mparams),
                Result("memory after the sends per million messages stored, RocketMQ: VmRSS", r_rss / (per["rocketmq"] / 1e6), "MiB", mparams),
                Result("memory after the sends per million messages stored, Quarry: VmRSS", q_rss / (per["quarry"] / 1e6), "MiB", mparams)]
    return results


def _free_ports() -> tuple[int, int]:
    """A NameServer port and a broker listenPort whose neighbours are free on every address: the
    broker binds 0.0.0.0 at listenPort, listenPort - 2 (its VIP channel) and listenPort + 1 (HA),
    and other sessions' e2e brokers may hold RocketMQ's defaults."""
    import random
    import socket

    def free(port: int) -> bool:
        with socket.socket() as sock:
            try:
                sock.bind(("0.0.0.0", port))
                return True
            except OSError:
                return False

    while True:
        base = random.randrange(20000, 30000)
        if all(free(base + d) for d in (-2, 0, 1, 5)):
            return base + 5, base


def _du(path: Path) -> int:
    """Bytes the files under `path` hold on disk (sparse files count what is written)."""
    return sum(f.stat().st_blocks * 512 for f in path.rglob("*") if f.is_file())
