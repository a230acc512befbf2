"""Apache RocketMQ's own NameServer and broker in the e2e tests (issue 36): the jars `make
rocketmq-broker` resolves from Maven Central (tests/java/broker/pom.xml: rocketmq-namesrv and
rocketmq-broker 4.9.7, the 4.x line's last broker there; tests/java/broker5/pom.xml: 5.3.3),
each in its own JVM with a small heap on its own loopback address, its store, its ROCKETMQ_HOME
(conf/, logs/) and its user.home in a temporary folder (5.x logs under user.home/logs/rocketmqlogs).

`RocketMQ` starts them and waits until they serve (each printed "boot success", the broker's
port accepts and the NameServer routes topics to it: GET_ROUTEINFO_BY_TOPIC), stops them
cleanly (SIGTERM: the broker's shutdown hook flushes and removes its `abort` file) or kills the
broker (SIGKILL: the next start runs its abnormal recovery), and says what its own logs hold at
WARN and above (`log_problems`).

Nothing here skips: without Java or without the jars, the test fails and says what is missing.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.e2e.java import java_binary

JAVA_DIR = Path(__file__).resolve().parent.parent / "java"
# The brokers Maven Central has, each from a pom of its own (their client jars would clash).
POMS = {"4.9.7": JAVA_DIR / "broker", "5.3.3": JAVA_DIR / "broker5"}
VERSION = "4.9.7"

# A small heap (RocketMQ's scripts give the broker 8 GB). On JDK 17 the broker needs two
# packages of java.base opened: MappedFile.clean unmaps a file (at a clean stop, at expiry)
# through DirectByteBuffer.attachment() and jdk.internal.ref.Cleaner.clean(); without them its
# shutdown hook throws InaccessibleObjectException, the stop is not clean and the next start
# fails. Netty 4.1.65 needs nothing opened.
JVM_FLAGS = [
    "-Xms64m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xss512k",
    "-XX:MaxDirectMemorySize=128m", "-XX:-OmitStackTraceInFastThrow",
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.ref=ALL-UNNAMED",
    "-Djava.net.preferIPv4Stack=true",
]

LOGBACK = """<configuration>
  <appender name="FILE" class="ch.qos.logback.core.FileAppender">
    <file>{log}</file>
    <encoder><pattern>%d{{yyyy-MM-dd HH:mm:ss.SSS}} %-5p [%t] %c{{1}} - %m%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="FILE"/></root>
</configuration>
"""

KIB = 1024
MIB = 1024 * KIB


def classpath(version: str = VERSION) -> str:
    jars_dir = POMS[version] / "target" / "dependency"
    jars = sorted(jars_dir.glob("*.jar")) if jars_dir.is_dir() else []
    if not any(j.name == f"rocketmq-broker-{version}.jar" for j in jars):
        pytest.fail(f"Apache RocketMQ's broker {version} is not built ({jars_dir} has no rocketmq-broker-{version}.jar): run "
                    f"`make rocketmq-broker` (Maven resolves {POMS[version].relative_to(JAVA_DIR.parent.parent)}/pom.xml; `make test` runs it)",
                    pytrace=False)
    return os.pathsep.join(map(str, jars))


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _wait(predicate, timeout_s: float, what: str, proc: "subprocess.Popen[bytes] | None" = None, log: Path | None = None) -> None:  # type: ignore[no-untyped-def]
    pause = threading.Event()
    end = time.monotonic() + timeout_s
    while not predicate():
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-4000:] if log is not None and log.exists() else ""
            raise RuntimeError(f"{what}: the process exited with {proc.returncode}\n{tail}")
        if time.monotonic() >= end:
            tail = log.read_text(errors="replace")[-4000:] if log is not None and log.exists() else ""
            raise TimeoutError(f"{what}: not within {timeout_s}s\n{tail}")
        pause.wait(0.05)


@dataclass
class RocketMQ:
    """A NameServer and one master broker on `host` (a 127.0.0.x address of their own)."""

    root: Path
    host: str
    broker_name: str = "broker-a"
    namesrv_port: int = 9876
    broker_port: int = 10911
    settings: dict[str, object] = field(default_factory=dict)  # broker.conf lines past the defaults below
    namesrv: "subprocess.Popen[bytes] | None" = None
    broker: "subprocess.Popen[bytes] | None" = None
    starts: int = 0
    version: str = VERSION

    def __post_init__(self) -> None:
        self.home = self.root / "rocketmq-home"
        self.store = self.root / "store"
        self.logs = self.home / "logs"
        (self.home / "conf").mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.store.mkdir(parents=True, exist_ok=True)
        for name in ("broker", "namesrv"):
            (self.home / "conf" / f"logback_{name}.xml").write_text(LOGBACK.format(log=self.logs / f"{name}.log"))

    # -- addresses and settings --------------------------------------------------------------
    @property
    def namesrv_addr(self) -> str:
        return f"{self.host}:{self.namesrv_port}"

    @property
    def broker_addr(self) -> str:
        return f"{self.host}:{self.broker_port}"

    def broker_conf(self) -> dict[str, object]:
        conf: dict[str, object] = {
            "brokerClusterName": "RealCluster",
            "brokerName": self.broker_name,
            "brokerId": 0,
            "brokerRole": "ASYNC_MASTER",
            "flushDiskType": "ASYNC_FLUSH",
            "namesrvAddr": self.namesrv_addr,
            "brokerIP1": self.host,
            "listenPort": self.broker_port,
            "storePathRootDir": self.store,
            "storePathCommitLog": self.store / "commitlog",
            "mappedFileSizeCommitLog": 1 * MIB,  # files roll every MiB
            "mappedFileSizeConsumeQueue": 300 * 20,  # 300 units a ConsumeQueue file
            "maxHashSlotNum": 1000,
            "maxIndexNum": 4000,  # an IndexFile every 4000 entries
            "fileReservedTime": 72,  # expiry is asked for by a test (expire_now)
            "deleteWhen": "04",
            "cleanResourceInterval": 1000,
            "destroyMapedFileIntervalForcibly": 1000,
            "deleteCommitLogFilesInterval": 10,
            "deleteConsumeQueueFilesInterval": 10,
            "autoCreateTopicEnable": "true",
            "defaultTopicQueueNums": 4,
            "diskMaxUsedSpaceRatio": 95,
            "flushIntervalCommitLog": 200,
            "flushIntervalConsumeQueue": 200,
            "transactionCheckInterval": 2000,
            "transactionTimeOut": 2000,
            "waitTimeMillsInSendQueue": 1000,
            "osPageCacheBusyTimeOutMills": 5000,
            "messageIndexSafe": "false",
        }
        conf.update(self.settings)
        return conf

    def _java(self, main: str, args: list[str], log: Path) -> "subprocess.Popen[bytes]":
        cmd = [java_binary(), *JVM_FLAGS, f"-Duser.home={self.root}", f"-Drocketmq.home.dir={self.home}",
               f"-Drocketmq.client.logRoot={self.logs}", "-cp", classpath(self.version), main, *args]
        env = {k: v for k, v in os.environ.items() if k not in ("NAMESRV_ADDR",)}
        env["ROCKETMQ_HOME"] = str(self.home)
        out = open(log, "ab")
        try:
            return subprocess.Popen(cmd, cwd=self.root, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        finally:
            out.close()

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self, timeout_s: float = 60) -> "RocketMQ":
        self.start_namesrv(timeout_s)
        self.start_broker(timeout_s)
        return self

    def start_namesrv(self, timeout_s: float = 60) -> None:
        conf = self.root / "namesrv.conf"
        conf.write_text(f"listenPort={self.namesrv_port}\n")
        log = self.logs / "namesrv.out"
        self.namesrv = self._java("org.apache.rocketmq.namesrv.NamesrvStartup", ["-c", str(conf)], log)
        _wait(lambda: log.exists() and b"boot success" in log.read_bytes(), timeout_s, "RocketMQ's NameServer", self.namesrv, log)

    def start_broker(self, timeout_s: float = 60) -> None:
        conf = self.root / "broker.conf"
        conf.write_text("".join(f"{k}={v}\n" for k, v in self.broker_conf().items()))
        self.starts += 1
        log = self.logs / f"broker-{self.starts}.out"
        self.broker = self._java("org.apache.rocketmq.broker.BrokerStartup", ["-c", str(conf)], log)
        _wait(lambda: log.exists() and b"boot success" in log.read_bytes(), timeout_s, "RocketMQ's broker", self.broker, log)
        _wait(lambda: _port_open(self.host, self.broker_port), timeout_s, "RocketMQ's broker port", self.broker, log)
        # 4.9 registers with the NameServer before it prints "boot success"; 5.3 may do it with
        # its first periodic registration, 10 s later: producers find no route until then.
        _wait(self.routed, timeout_s, "RocketMQ's broker registered with its NameServer", self.broker, log)

    def routed(self) -> bool:
        """Whether the NameServer routes the auto-create topic (TBW102) to this broker."""
        import asyncio

        from quarry.services.remoting import codes
        from tests.remoting_client import RemotingClient

        async def ask() -> bool:
            async with RemotingClient(self.namesrv_addr) as client:
                answer = await client.call(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"}, timeout_s=5)
                return answer.code == codes.SUCCESS and self.broker_addr.encode() in answer.body

        try:
            return asyncio.run(ask())
        except (OSError, asyncio.TimeoutError, ConnectionError):
            return False

    def stop_broker(self, timeout_s: float = 30) -> int:
        """SIGTERM: the broker's shutdown hook flushes its files and removes `abort` (a clean stop)."""
        return _stop(self.broker, timeout_s)

    def kill_broker(self) -> None:
        """SIGKILL: what the broker had not flushed stays in the page cache; `abort` stays, and the
        next start recovers from the CommitLog (recoverAbnormally)."""
        if self.broker is not None and self.broker.poll() is None:
            self.broker.send_signal(signal.SIGKILL)
            self.broker.wait()

    def stop(self) -> None:
        _stop(self.broker, 30)
        _stop(self.namesrv, 30)

    # -- what it says --------------------------------------------------------------------------
    def log_problems(self) -> list[str]:
        """Lines of its own logs at WARN or ERROR, or naming an exception."""
        found = []
        for path in sorted([*self.logs.glob("*"), *(self.root / "logs" / "rocketmqlogs").glob("*.log")]):
            if not path.is_file():
                continue
            for line in path.read_text(errors="replace").splitlines():
                if " ERROR " in line or " WARN " in line or "Exception" in line:
                    found.append(f"{path.name}: {line}")
        return found


def _stop(proc: "subprocess.Popen[bytes] | None", timeout_s: float) -> int:
    if proc is None:
        return 0
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return int(proc.returncode)


class DriverStream:
    """One of tests/java's drivers (Producer4, TxProducer4) in its own JVM, its plan on stdin,
    its JSON lines read as they come (with the time each arrived), for loads that run while the
    test does other things (kills the broker, checks Quarry)."""

    def __init__(self, main_class: str, plan: object, work_dir: Path) -> None:
        import json
        import queue
        import tempfile

        from tests.e2e import java

        self._json = json
        work_dir.mkdir(parents=True, exist_ok=True)
        home = java.rocketmq_home(Path(tempfile.mkdtemp(prefix="driver-", dir=work_dir)))
        cmd = [java.java_binary(), *java.JVM_FLAGS, f"-Drocketmq.client.logRoot={home / 'client-logs'}", "-Drocketmq.client.logLevel=WARN",
               f"-Drocketmq.home.dir={home}", f"-Duser.home={home}", f"-Dlogback.configurationFile={home / 'conf' / 'logback_tools.xml'}",
               "-cp", java.classpath("rmq4"), main_class]
        env = {k: v for k, v in os.environ.items() if k not in ("NAMESRV_ADDR", "ROCKETMQ_HOME")}
        env["ROCKETMQ_HOME"] = str(home)
        self.stderr_path = home / "stderr.txt"
        self._stderr = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(cmd, cwd=home, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True)
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(plan))
        self.proc.stdin.close()
        self.lines: "queue.Queue[dict[str, object]]" = queue.Queue()
        self.all: list[dict[str, object]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            if raw.startswith("{"):
                line = self._json.loads(raw)
                line["_seenMs"] = time.time() * 1000
                self.all.append(line)
                self.lines.put(line)
        self.lines.put({"_eof": True})

    def wait(self, timeout_s: float = 120) -> list[dict[str, object]]:
        """Every line, once the JVM exited 0 (fails the test otherwise)."""
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"driver did not finish in {timeout_s}s: {self.stderr_path.read_text(errors='replace')[-3000:]}", pytrace=False)
        self._reader.join(10)
        self._stderr.close()
        assert code == 0, f"driver exited {code}: {self.stderr_path.read_text(errors='replace')[-3000:]}"
        return self.all

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._stderr.close()
