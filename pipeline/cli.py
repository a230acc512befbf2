"""`quarry-pipeline <job>` (also `python -m quarry.pipeline <job>`): reindex, export, lookup.

Every option is a flag, else an environment variable, else a default (`--help` shows all
three). Exit codes: 0 done, 2 bad usage, 3 a corrupt record under the fail policy, 1 any
other failure.
"""
from __future__ import annotations

import argparse
import re
import sys
import time
import traceback
from typing import Any

from quarry.services.settings import EnvArgumentParser, parse_bool

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CORRUPT = 0, 1, 2, 3


def _add_spark_settings(p: EnvArgumentParser) -> None:
    p.add_setting("--master", "QUARRY_SPARK_MASTER", "local[*]", "Spark master: local[N], spark://host:7077, yarn, k8s://…")
    p.add_setting("--driver-memory", "QUARRY_SPARK_DRIVER_MEMORY", "2g", "spark.driver.memory")
    p.add_setting("--executor-memory", "QUARRY_SPARK_EXECUTOR_MEMORY", "", "spark.executor.memory (cluster masters; empty: Spark's default)")
    p.add_setting("--shuffle-partitions", "QUARRY_SPARK_SHUFFLE_PARTITIONS", 8, "spark.sql.shuffle.partitions", int)
    p.add_setting("--ui", "QUARRY_SPARK_UI", False, "serve the Spark web UI", parse_bool)
    p.add_setting("--local-ip", "QUARRY_SPARK_LOCAL_IP", "127.0.0.1", "SPARK_LOCAL_IP and driver address for local masters (empty: Spark's choice)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="any other Spark setting (repeatable); wins over the flags above")


def _add_job_settings(p: EnvArgumentParser, reads_segments: bool = True) -> None:
    p.add_setting("--progress-interval", "QUARRY_PIPELINE_PROGRESS_INTERVAL", 5.0, "seconds between progress lines on stderr (0: only stage start/end)", float)
    p.add_argument("--quiet", action="store_true", help="no progress lines, only the summary")
    p.add_argument("--verbose", action="store_true", help="Spark's own log, and on failure the full Python and Java stack traces (default: one line saying why)")
    p.add_argument("--summary-json", default="", metavar="PATH", help="also write the summary as JSON to PATH")
    if reads_segments:
        p.add_setting("--skip-corrupt", "QUARRY_PIPELINE_SKIP_CORRUPT", False, "skip corrupt records and report them (default: fail naming file and offset)", parse_bool)
        p.add_setting("--split-bytes", "QUARRY_PIPELINE_SPLIT_BYTES", 0, "cut segments into tasks of about this many bytes at record boundaries (0: automatic)", int)
        p.add_argument("--per-segment", action="store_true", help="exactly one task per segment file (no boundary scan)")


def _store_arg(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument(
        "--store",
        action="append",
        default=[],
        required=required,
        metavar="[NAME=]PATH",
        help="a broker's store directory (or its commitlog/ directory), Quarry or Apache RocketMQ 4.x; "
        "NAME is the broker name (default: the directory's name). Repeat for several brokers.",
    )


def _store_time(text: str) -> int:
    """--begin/--end: the `quarry` CLI's time forms, read by its one parser."""
    from quarry.clients.cli_options import parse_time  # driver only: executors never parse flags

    try:
        return parse_time(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="quarry-pipeline",
        description="PySpark jobs over CommitLog stores: rebuild IndexFiles, export a Parquet catalog, bulk look-ups.",
    )
    sub = parser.add_subparsers(dest="job", metavar="<job>", parser_class=EnvArgumentParser)
    sub.required = True

    r = sub.add_parser("reindex", help="rebuild IndexFiles + checkpoint from CommitLog segments, in parallel",
                       description="Read brokers' CommitLog segments in parallel and build RocketMQ IndexFiles in parallel. "
                       "Writes OUT/<broker>/index/ and OUT/<broker>/quarry-index-checkpoint.json: start the indexer with "
                       "--index-dir OUT/<broker> and it continues tailing from where the rebuild ended.")
    _store_arg(r)
    r.add_argument("--out", required=True, help="output directory (OUT/<broker>/index/, OUT/<broker>/quarry-index-checkpoint.json)")
    r.add_setting("--hash-slots", "QUARRY_INDEX_HASH_SLOTS", 5_000_000, "hash slots per IndexFile (must match the indexer's)", int)
    r.add_setting("--index-num", "QUARRY_INDEX_NUM", 20_000_000, "entries per IndexFile, holds index-num - 1 (must match the indexer's)", int)
    r.add_argument("--overwrite", action="store_true", help="replace an existing OUT/<broker>/ index and checkpoint (refused while an indexer writes it)")
    _add_job_settings(r)
    _add_spark_settings(r)

    e = sub.add_parser("export", help="write a Parquet message catalog partitioned by broker, topic and store date",
                       description="Decode every record of the stores into a Parquet catalog partitioned by "
                       "broker / topic / store_date (UTC).")
    _store_arg(e)
    e.add_argument("--out", required=True, help="catalog directory (Parquet)")
    e.add_argument("--with-body", action="store_true", help="include the stored body bytes (column body)")
    e.add_argument("--overwrite", action="store_true", help="replace an existing catalog")
    e.add_argument("--one-file-per-partition", action="store_true",
                   help="shuffle rows by broker/topic/date so each partition directory gets one file (default: one file per task and partition)")
    _add_job_settings(e)
    _add_spark_settings(e)

    q = sub.add_parser("lookup", help="bulk look-ups of keys, unique keys or offsetMsgIds against a catalog (a join)",
                       description="Join a file of queries against a catalog (from `export`, or built on the fly from "
                       "--store) with the router's rules: exact topic and exact KEYS token for keys; the earliest "
                       "copy by store time (and the number of copies) for unique keys.")
    q.add_argument("--catalog", default="", help="catalog directory written by `export`")
    _store_arg(q, required=False)
    q.add_argument("--queries", required=True, help="text file, one query a line: 'TOPIC KEY' (or just KEY with --topic); offsetMsgIds alone")
    q.add_argument("--type", required=True, choices=["key", "unique-key", "msg-id"], help="what the lines hold")
    q.add_argument("--topic", default="", help="topic of every key / unique key in the file")
    q.add_argument("--out", required=True, help="output path")
    q.add_argument("--format", default="parquet", choices=["parquet", "csv", "json"], help="output format (json: JSON lines)")
    q.add_argument("--max-num", type=int, default=0, help="keys: at most this many matches per key, newest first (0: all)")
    q.add_argument("--all-copies", action="store_true", help="unique keys: every copy, not only the earliest")
    q.add_argument("--begin", type=_store_time, default=0, metavar="TIME",
                   help="keys: earliest store time, in the forms `quarry -b` takes: epoch ms, ISO-8601 with Z or an offset, "
                   "or a local time as `quarry` prints it (2024-05-01 12:00:00,123)")
    q.add_argument("--end", type=_store_time, default=0, metavar="TIME", help="keys: latest store time, same forms (0: no limit)")
    q.add_argument("--single-file", action="store_true", help="write one output file (coalesce(1))")
    q.add_argument("--overwrite", action="store_true", help="replace an existing output")
    _add_job_settings(q)
    _add_spark_settings(q)
    return parser


def spark_settings(args: argparse.Namespace) -> Any:
    from quarry.pipeline.session import SparkSettings, parse_conf

    return SparkSettings(
        master=args.master,
        app_name=f"quarry-pipeline {args.job}",
        driver_memory=args.driver_memory,
        executor_memory=args.executor_memory,
        shuffle_partitions=args.shuffle_partitions,
        ui=args.ui,
        local_ip=args.local_ip,
        verbose=bool(getattr(args, "verbose", False)),
        conf=parse_conf(args.conf),
    )


def run(args: argparse.Namespace) -> Any:
    """Run the job `args` describes; returns its Summary (raises on failure)."""
    return run_job(args)


def run_job(args: argparse.Namespace) -> Any:
    """Start Spark, run one job (the CLI dispatches: jobs know nothing of each other), write the summary."""
    from quarry.pipeline.corrupt import CorruptPolicy, CorruptRecordError
    from quarry.pipeline.jobs import JobContext, JobError, open_inputs
    from quarry.pipeline.progress import Progress
    from quarry.pipeline.session import start_session
    from quarry.pipeline.summary import Summary

    summary = Summary(job=args.job)
    try:
        settings = spark_settings(args)
    except ValueError as exc:
        raise JobError(str(exc), usage=True) from exc
    summary.master = settings.master
    if args.job == "lookup":
        from quarry.pipeline.lookup import validate_args

        validate_args(args)
    elif args.job in ("reindex", "export"):
        open_inputs(args)  # fail on bad stores before starting a JVM
    spark = start_session(settings)
    progress = Progress(spark.sparkContext, args.job, interval_s=args.progress_interval, quiet=args.quiet)
    ctx = JobContext(args, spark, progress, summary, CorruptPolicy(skip=bool(getattr(args, "skip_corrupt", False))))
    try:
        if args.job == "reindex":
            from quarry.pipeline.reindex import run_reindex

            run_reindex(ctx)
        elif args.job == "export":
            from quarry.pipeline.export import run_export

            run_export(ctx)
        elif args.job == "lookup":
            from quarry.pipeline.lookup import run_lookup

            run_lookup(ctx)
        else:  # pragma: no cover - argparse restricts the choices
            raise JobError(f"unknown job {args.job!r}", usage=True)
    except CorruptRecordError as exc:
        summary.ok, summary.error = False, exc.message()
        raise
    except JobError as exc:
        summary.ok, summary.error = False, str(exc)
        raise
    finally:
        summary.seconds = time.monotonic() - ctx.started
        summary.stages = list(progress.stages)
        progress.close()
        if getattr(args, "summary_json", ""):
            summary.write_json(args.summary_json)
    return summary


_EXCEPTION_LINE = re.compile(r"^\s*([A-Za-z_][\w.$]*(?:Error|Exception|Exit|Interrupt)\b.*)$")


def failure_reason(exc: BaseException) -> str:
    """One line saying why a job failed, from a Python, PySpark or Java (Py4J) exception.

    A task's Python error comes back wrapped in Java exceptions whose message holds the
    worker's traceback: its last `SomeError: …` line is the reason. Otherwise the first
    line of the exception's own message, named by its class."""
    java = getattr(exc, "java_exception", None)
    if java is not None:  # Py4JJavaError: the JVM exception's class and message
        try:
            text = f"{java.getClass().getName()}: {java.getMessage()}"
        except Exception:  # noqa: BLE001 - the gateway may be gone
            text = str(exc)
    else:
        desc = getattr(exc, "desc", None)  # PySpark's CapturedException (AnalysisException, PythonException, …)
        text = f"{type(exc).__name__}: {desc if desc is not None else exc}"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if "Traceback (most recent call last)" in text:
        raised = [m.group(1) for ln in text.splitlines() if (m := _EXCEPTION_LINE.match(ln)) and not ln.startswith((" ", "\t"))]
        if raised:
            return raised[-1]
    return lines[0] if lines else type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    from quarry.pipeline.corrupt import CorruptRecordError
    from quarry.pipeline.jobs import JobError

    try:
        summary = run(args)
    except CorruptRecordError as exc:
        print(f"quarry-pipeline {args.job}: failed: {exc.message()}", file=sys.stderr)
        return EXIT_CORRUPT
    except JobError as exc:
        print(f"quarry-pipeline {args.job}: failed: {exc}", file=sys.stderr)
        return EXIT_USAGE if exc.usage else EXIT_FAILED
    except Exception as exc:  # Spark's and the JVM's errors: one line, the stacks only when asked
        print(f"quarry-pipeline {args.job}: failed: {failure_reason(exc)}", file=sys.stderr)
        if args.verbose:
            traceback.print_exc(file=sys.stderr)
            jvm_stack = getattr(exc, "stackTrace", None)  # PySpark keeps the JVM's apart
            if jvm_stack and jvm_stack not in str(exc):
                print(f"JVM stack trace:\n{jvm_stack}", file=sys.stderr)
        return EXIT_FAILED
    print(summary.render())
    return EXIT_OK if summary.ok else EXIT_FAILED
