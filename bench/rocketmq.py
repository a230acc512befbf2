"""Quarry against Apache RocketMQ's own broker on the same machine, in one run (issue 36, part 3):
the same Java client, the same messages, both servers up side by side.

- Sends: `quarry.bench.Bench4` (RocketMQ 4.9.8's `DefaultMQProducer`, sync sends of 1 KiB bodies
  with the benchmark Producer's key, no compression; bench java_clients) at 1, 16 and 64 threads,
  against RocketMQ 4.9.7's NameServer + broker (tests/e2e/rocketmq_broker.py, `make
  rocketmq-broker`) and against a Quarry cluster (router + one broker: commitlog and indexer;
  namesrvAddr: the router's remoting port). Rate, p50, p99 and Quarry / RocketMQ. Each thread
  count sends to RocketMQ then to Quarry, then (round 2, when --rounds 2) Quarry then RocketMQ;
  medians of the rounds.
- Queries: `quarry.bench.Query4` through `DefaultMQAdminExt` (queryMessage by key,
  queryMessageByUniqKey, viewMessage by offsetMsgId), a key present and a key absent, one at a
  time, against both; one IndexFile on the broker (RocketMQ's default 20M entries a file: every
  message of the run fits in its first). 256 IndexFiles were not run.
- Memory: VmRSS (and its anonymous and file parts) of the broker JVM and the NameServer JVM
  against Quarry's router, commitlog and indexer after the sends, and per million messages sent.

The broker runs with RocketMQ's own defaults for its files (1 GiB CommitLog files, 20M-entry
IndexFiles, ASYNC_FLUSH, ASYNC_MASTER) and a 1 GiB G1 heap, full JIT (RocketMQ's scripts give it
8 GB; this machine is shared); Quarry's commitlog with 512 MiB segments and flush mode ASYNC.

`.venv/bin/python -m bench rocketmq [--messages N] [--rounds N] [--queries N]` (after `make
java-clients rocketmq-broker`)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from bench.ceiling import Stats, median_run, pct
from bench.java_clients import JVM_FLAGS as CLIENT_JVM_FLAGS, java_send
from bench.runner import Result, process_cpu_s
from scripts.launcher import LocalCluster
from tests.e2e import java
from tests.e2e.rocketmq_broker import RocketMQ, classpath as broker_classpath, java_binary

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


def run(argv: list[str]) -> list[Result]:
    p = argparse.ArgumentParser(prog="bench rocketmq")
    p.add_argument("--messages", type=int, default=10000, help="sends at each thread count in one round, each server")
    p.add_argument("--rounds", type=int, default=2, help="rounds (the order of the servers alternates; medians)")
    p.add_argument("--queries", type=int, default=300, help="queries of each kind, each server (0: none)")
    p.add_argument("--seed", type=int, default=2000, help="messages with keys of their own the queries ask for")
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
            assert rmq.broker is not None and rmq.namesrv is not None
            pids = {"rocketmq broker JVM": rmq.broker.pid, "quarry router": cluster.router.proc.pid,  # type: ignore[union-attr]
                    "quarry commitlog": b.commitlog.proc.pid, "quarry indexer": b.indexer.proc.pid}  # type: ignore[union-attr]
            mem_start = {k: memory(pid) for k, pid in pids.items()}
            mem_start["rocketmq NameServer JVM"] = memory(rmq.namesrv.pid)
            for r in range(rounds):
                for threads in THREADS:
                    order = ("rocketmq", "quarry") if r % 2 == 0 else ("quarry", "rocketmq")
                    for server in order:
                        cpu0, t0 = {k: process_cpu_s(pid) for k, pid in pids.items()}, time.monotonic()
                        s = java_send("rmq4", targets[server], threads, n, root / f"send-{server}-{r}-{threads}")
                        wall = time.monotonic() - t0
                        # Cores each server process used over the JVM's life (its 5 s warm-up and the measured sends).
                        cores.setdefault((server, threads), []).append(
                            {k: round((process_cpu_s(pid) - cpu0[k]) / wall, 2) for k, pid in pids.items() if k.startswith(server)})
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
    params["loadavg_1m"] = f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after"
    results: list[Result] = []
    for threads in THREADS:
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
               "index_files_256": "not run", "messages_before": f"rocketmq {sent['rocketmq']:,}, quarry {sent['quarry']:,} (+ warm-up sends)"}
    if all("latMs" in q for q in queries.values()) and queries:
        for kind, label in KINDS.items():
            figs = {}
            for server, name in (("rocketmq", "RocketMQ 4.9.7 broker"), ("quarry", "Quarry")):
                lat = queries[server]["latMs"][kind]  # type: ignore[index]
                wrong = queries[server]["wrong"][kind]  # type: ignore[index]
                figs[server] = (pct(lat, 0.5), pct(lat, 0.99))
                at = {**qparams, "wrong_answers": wrong}
                results += [Result(f"query {label}, {name}, p50", figs[server][0], "ms", at),
                            Result(f"query {label}, {name}, p99", figs[server][1], "ms", at)]
            results += [Result(f"query {label}, Quarry / RocketMQ: p50", figs["quarry"][0] / figs["rocketmq"][0], "x", qparams),
                        Result(f"query {label}, Quarry / RocketMQ: p99", figs["quarry"][1] / figs["rocketmq"][1], "x", qparams)]
    else:
        for server, q in queries.items():
            if "error" in q:
                results.append(Result(f"query run failed, {server}: {str(q['error'])[:300]}", 0, "-", qparams))
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
