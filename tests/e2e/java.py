"""Apache RocketMQ's own Java clients and mqadmin in the e2e tests (issue 35): find java, build
the classpath `make java-clients` made (tests/java/pom.xml's jars in tests/java/target/dependency,
the drivers of tests/java/src in tests/java/target/classes), run one driver in one JVM with a
small heap, and read the JSON lines it prints.

Nothing here skips: without Java, or without the jars and drivers built, the test fails and
says what is missing and which make target brings it.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Sequence

import pytest

JAVA_DIR = Path(__file__).resolve().parent.parent / "java"
TARGET = JAVA_DIR / "target"
CLASSES = TARGET / "classes"
JARS = TARGET / "dependency"
STAMP = TARGET / ".built"
RMQ5_JAR_PREFIX = "rocketmq-client-java-"  # the 5.x gRPC client: shaded, kept off the 4.x classpath

# RocketMQ's scripts start JVMs with 8 GB heaps; a driver needs little. JDK 17 closes the
# internals netty and RocketMQ 4.9's remoting reach into; open them as RocketMQ's own runbroker.sh
# does for JDK 9+.
JVM_FLAGS = [
    "-Xms16m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xss512k",
    "-XX:MaxDirectMemorySize=128m",
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens=java.base/java.util=ALL-UNNAMED",
    "-Dio.netty.tryReflectionSetAccessible=true",
    "-Djava.net.preferIPv4Stack=true",
]

LOGBACK_TOOLS = """<configuration>
  <appender name="FILE" class="ch.qos.logback.core.FileAppender">
    <file>${rocketmq.home.dir}/logs/tools.log</file>
    <encoder><pattern>%d %-5p %c{1} - %m%n</pattern></encoder>
  </appender>
  <root level="WARN"><appender-ref ref="FILE"/></root>
</configuration>
"""


def java_binary() -> str:
    """java of JAVA_HOME, else the one on PATH; fails the test naming what is missing."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if not found:
        pytest.fail("Java is needed for RocketMQ's Java clients and mqadmin: no java on PATH and no JAVA_HOME "
                    "(a JDK 17 and Maven; then `make java-clients`, which `make test` runs)", pytrace=False)
    return found


def classpath(flavor: str = "rmq4") -> str:
    """The drivers and the jars: flavor "rmq4" (RocketMQ 4.9.8 client, tools, acl) or "rmq5"
    (rocketmq-client-java 5.x alone: it shades what it needs)."""
    jars = sorted(JARS.glob("*.jar")) if JARS.is_dir() else []
    if not CLASSES.is_dir() or not jars or not STAMP.is_file():
        pytest.fail(f"RocketMQ's Java clients are not built ({TARGET} is missing or incomplete): run `make java-clients` "
                    "(Maven resolves tests/java/pom.xml; `make test` runs it)", pytrace=False)
    built = STAMP.stat().st_mtime
    stale = [p for p in [JAVA_DIR / "pom.xml", *JAVA_DIR.joinpath("src").rglob("*.java")] if p.stat().st_mtime > built]
    if stale:
        pytest.fail(f"tests/java changed since the last build ({', '.join(str(p.relative_to(JAVA_DIR)) for p in stale[:3])}): "
                    "run `make java-clients`", pytrace=False)
    if flavor == "rmq4":
        picked = [j for j in jars if not j.name.startswith(RMQ5_JAR_PREFIX)]
    elif flavor == "rmq5":
        picked = [j for j in jars if j.name.startswith(RMQ5_JAR_PREFIX)]
    else:
        raise ValueError(flavor)
    return os.pathsep.join([str(CLASSES), *map(str, picked)])


def rocketmq_home(root: Path) -> Path:
    """A ROCKETMQ_HOME for mqadmin: MQAdminStartup configures logback from conf/logback_tools.xml
    (and runs no command without it) and reads conf/tools.yml for ACL credentials when present."""
    (root / "conf").mkdir(parents=True, exist_ok=True)
    (root / "logs").mkdir(exist_ok=True)
    (root / "conf" / "logback_tools.xml").write_text(LOGBACK_TOOLS)
    return root


def run_java(main_class: str, *args: str, stdin: str | None = None, timeout_s: float = 120, flavor: str = "rmq4",
             work_dir: Path | None = None, jvm_args: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    """One JVM running main_class. The clients' own logs (and mqadmin's home) go under work_dir
    (a new temporary folder when None), never to ~/logs."""
    work = work_dir or Path(tempfile.mkdtemp(prefix="quarry-java-"))
    home = rocketmq_home(work / "rocketmq-home")
    cmd = [java_binary(), *JVM_FLAGS,
           f"-Drocketmq.client.logRoot={work / 'client-logs'}", "-Drocketmq.client.logLevel=WARN",
           f"-Drocketmq.log.root={work / 'client-logs'}",  # rocketmq-client-java 5.x
           f"-Drocketmq.home.dir={home}", f"-Duser.home={work}",
           f"-Dlogback.configurationFile={home / 'conf' / 'logback_tools.xml'}",  # RocketMQ 4 remoting logs via slf4j: to a file
           *jvm_args, "-cp", classpath(flavor), main_class, *args]
    env = {k: v for k, v in os.environ.items() if k not in ("NAMESRV_ADDR", "ROCKETMQ_HOME")}
    env["ROCKETMQ_HOME"] = str(home)
    try:
        return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout_s, cwd=work, env=env)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        pytest.fail(f"{main_class} did not finish in {timeout_s}s\nstdout: {out[-3000:]}\nstderr: {err[-3000:]}", pytrace=False)


def json_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects a driver printed, one a line (anything else on stdout is left out)."""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def run_driver(main_class: str, plan: Any = None, *args: str, timeout_s: float = 120, flavor: str = "rmq4",
               work_dir: Path | None = None, jvm_args: Sequence[str] = ()) -> list[dict[str, Any]]:
    """run_java with `plan` as JSON on stdin; fails unless the JVM exits 0; the JSON lines printed."""
    run = run_java(main_class, *args, stdin=None if plan is None else json.dumps(plan), timeout_s=timeout_s, flavor=flavor,
                   work_dir=work_dir, jvm_args=jvm_args)
    assert run.returncode == 0, f"{main_class} exited {run.returncode}\nstdout: {run.stdout[-3000:]}\nstderr: {run.stderr[-5000:]}"
    return json_lines(run.stdout)


def mqadmin(commands: Sequence[Sequence[str]], work_dir: Path | None = None, deadline_ms: int = 30000,
            timeout_s: float = 180) -> list[dict[str, Any]]:
    """The real mqadmin (MQAdminStartup of rocketmq-tools 4.9.8), every command in one JVM:
    [{"args", "out", "err", "ms", "hung"}], one per command, in order."""
    return run_driver("quarry.drivers.MqAdmin", [list(c) for c in commands], str(deadline_ms), timeout_s=timeout_s, work_dir=work_dir)
