"""SparkSession set-up for the pipeline jobs: small-machine defaults, every one overridable.

Defaults are chosen for one machine (`local[*]`, 2 GiB driver, UI off, loopback address);
on a cluster pass `--master` and whatever `--conf key=value` the cluster needs. PySpark is
imported lazily so `python -m quarry.pipeline --help` works without starting a JVM.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

# Packages a cluster's executors need (shipped with --py-files when the master is not local).
SHIPPED_PACKAGES = ("quarry.formats", "quarry.pipeline", "quarry.v1")


@dataclass
class SparkSettings:
    """What a job needs to start Spark; `from_args` reads the CLI's common flags."""

    master: str = "local[*]"
    app_name: str = "quarry-pipeline"
    driver_memory: str = "2g"
    executor_memory: str = ""
    shuffle_partitions: int = 8
    ui: bool = False
    local_ip: str = "127.0.0.1"
    log_level: str = "WARN"
    # Spark's own log lines (task failures come with a Java stack trace): off unless --verbose;
    # a failing job prints one line with its reason instead (cli.failure_reason).
    verbose: bool = False
    ship_code: bool | None = None  # None: ship when the master is not local
    conf: dict[str, str] = field(default_factory=dict)

    @property
    def is_local(self) -> bool:
        return self.master == "local" or self.master.startswith("local[") or self.master.startswith("local-cluster")

    def spark_conf(self) -> dict[str, str]:
        """The Spark configuration this job starts with (explicit --conf wins)."""
        conf = {
            "spark.master": self.master,
            "spark.app.name": self.app_name,
            "spark.driver.memory": self.driver_memory,
            "spark.sql.shuffle.partitions": str(self.shuffle_partitions),
            "spark.ui.enabled": "true" if self.ui else "false",
            "spark.ui.showConsoleProgress": "false",  # the jobs print their own progress
            "spark.python.worker.reuse": "true",
            "spark.sql.session.timeZone": "UTC",  # store_date partitions are UTC dates
            "spark.sql.sources.partitionOverwriteMode": "static",
            # catalog partition values (topic, store_date) stay strings when read back
            "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
        }
        if self.executor_memory:
            conf["spark.executor.memory"] = self.executor_memory
        if not self.verbose:
            # The driver JVM's log4j starts with this file: not even its start-up warnings print.
            conf["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile=file:{_quiet_log4j_file()}"
        if self.is_local and self.local_ip:
            conf["spark.driver.host"] = self.local_ip
            conf["spark.driver.bindAddress"] = self.local_ip
        conf.update(self.conf)
        return conf


# An appender must exist (with none, Spark takes log4j for unconfigured and installs its own);
# it lets nothing through. The root level is Spark's shell default (WARN), so PySpark does not
# announce a change of level either.
_QUIET_LOG4J = """appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %m%n
appender.console.filter.none.type = ThresholdFilter
appender.console.filter.none.level = off
appender.console.filter.none.onMatch = ACCEPT
appender.console.filter.none.onMismatch = DENY
rootLogger.level = warn
rootLogger.appenderRef.console.ref = console
"""


def _quiet_log4j_file() -> str:
    """A log4j2 configuration that logs nothing (written once, named by its content)."""
    digest = hashlib.sha256(_QUIET_LOG4J.encode()).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / f"quarry-pipeline-log4j2-quiet-{os.getuid()}-{digest}.properties"
    if not path.exists():
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(_QUIET_LOG4J)
        os.replace(tmp, path)
    return str(path)


def parse_conf(items: list[str] | None) -> dict[str, str]:
    """['k=v', …] → {k: v}; raises ValueError naming the bad item."""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--conf: expected key=value, got {item!r}")
        out[key.strip()] = value
    return out


def _prepare_environment(settings: SparkSettings) -> None:
    # Python workers must run the same interpreter (the venv) as the driver.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if settings.is_local and settings.local_ip:
        os.environ.setdefault("SPARK_LOCAL_IP", settings.local_ip)


def build_code_zip(dest_dir: Path) -> Path:
    """Zip the project's packages for `--py-files` on a cluster."""
    path = dest_dir / "quarry-pipeline-code.zip"
    # Arc names come from module names, not folders: the installed package maps
    # quarry.formats to formats/ (editable) or quarry/formats/ (wheel) alike.
    import importlib

    import quarry

    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.write(quarry.__file__, "quarry/__init__.py")
        for name in SHIPPED_PACKAGES:
            pkg = importlib.import_module(name)
            prefix = name.replace(".", "/")
            for base in map(Path, pkg.__path__):
                for file in sorted(base.rglob("*.py")):
                    if "__pycache__" not in file.parts:
                        zf.write(file, f"{prefix}/{file.relative_to(base).as_posix()}")
    return path


def start_session(settings: SparkSettings) -> "SparkSession":
    """Start (or reuse) the SparkSession described by `settings`."""
    _prepare_environment(settings)
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:  # pragma: no cover - make setup installs it
        raise SystemExit("pyspark is not installed: run `make setup` (it installs the pinned pyspark)") from exc
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise SystemExit("no Java runtime found: run `make setup` (scripts/ensure_java.sh installs openjdk-17-jre-headless)")
    builder: Any = SparkSession.builder
    for key, value in settings.spark_conf().items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(settings.log_level if settings.verbose else "OFF")
    ship = settings.ship_code if settings.ship_code is not None else not settings.is_local
    if ship:
        tmp = Path(tempfile.mkdtemp(prefix="quarry-pipeline-"))
        spark.sparkContext.addPyFile(str(build_code_zip(tmp)))
    return spark
