"""`lookup`: bulk queries against a catalog, as joins, with the router's rules.

* **key** (`queryMsgByKey`): a message matches when its topic is exactly the query's and
  one of its KEYS tokens is exactly the key — what the router keeps after filtering hash
  collisions. Rollback records are not indexed, so they never match. Matches are ranked
  newest first (store time, then broker, then physical offset newest first), as the
  router orders a page; `--max-num` caps them per key.
* **unique-key** (`queryMsgByUniqueKey`): an id that is the offsetMsgId of a message of
  the topic is that message (the router reads such an id directly). Otherwise every copy
  with that UNIQ_KEY in the topic is found and the earliest by store time (then broker,
  then physical offset) is returned with the number of copies; `--all-copies` returns
  them all, earliest first.
* **msg-id** (`queryMsgById`): the record whose offsetMsgId is the id (case-insensitive).

Every query gets at least one output row: `found` is false (and the message columns null)
when nothing matched. Lines that are not a query (wrong shape, not an id) are counted and
reported, never silently dropped.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from quarry.formats.index_keys import NOT_INDEXED_TRANSACTION
from quarry.formats.record import SYSFLAG_TRANSACTION_MASK
from quarry.pipeline.jobs import JobContext, JobError, describe_inputs, open_inputs, plan_splits

# Columns a result row carries after the query columns (the catalog's, body left out).
MESSAGE_COLUMNS = (
    "broker", "topic", "queue_id", "queue_offset", "physical_offset", "store_size", "offset_msg_id", "unique_key",
    "keys", "tags", "store_timestamp", "born_timestamp", "store_host", "born_host", "sys_flag", "flag",
    "reconsume_times", "prepared_transaction_offset", "body_size", "body_crc", "properties", "store_date",
)
QUERY_COLUMNS = ("query_type", "query_topic", "query", "found", "matches", "rank", "matched_by")
KEY_LINE = r"^(\S+)\s+(\S+)$"
MSG_ID = r"^([0-9A-F]{32}|[0-9A-F]{56})$"


def validate_args(args: argparse.Namespace) -> None:
    if bool(args.catalog) == bool(args.store):
        raise JobError("lookup: give exactly one of --catalog DIR or --store [NAME=]PATH…", usage=True)
    if args.catalog and not Path(args.catalog).is_dir():
        raise JobError(f"--catalog {args.catalog}: not a directory (write one with `export`)", usage=True)
    if not Path(args.queries).is_file():
        raise JobError(f"--queries {args.queries}: no such file", usage=True)
    if args.type == "msg-id" and args.topic:
        raise JobError("--topic: offsetMsgIds name their broker and offset, not a topic; drop --topic", usage=True)
    if args.max_num < 0:
        raise JobError("--max-num: must be >= 0 (0: all matches)", usage=True)
    if args.begin < 0 or args.end < 0 or (args.end and args.end < args.begin):
        raise JobError("--begin/--end: store times with begin <= end (end 0: no limit)", usage=True)
    if os.path.exists(args.out) and not args.overwrite:
        raise JobError(f"--out {args.out}: exists (use --overwrite to replace it)", usage=True)


def read_queries(spark: Any, path: str, qtype: str, topic: str) -> tuple[Any, Any]:
    """(queries, malformed lines) DataFrames: queries have query_topic (null for msg-id) and query."""
    from pyspark.sql import functions as F

    lines = spark.read.text(path).select(F.trim(F.col("value")).alias("line"))
    lines = lines.filter((F.col("line") != "") & ~F.col("line").startswith("#"))
    if qtype == "msg-id":
        parsed = lines.select(F.lit(None).cast("string").alias("query_topic"), F.upper(F.col("line")).alias("query"), "line")
        ok = F.col("query").rlike(MSG_ID)
    elif topic:
        parsed = lines.select(F.lit(topic).alias("query_topic"), F.col("line").alias("query"), "line")
        ok = ~F.col("query").rlike(r"\s")
    else:
        parsed = lines.select(
            F.regexp_extract("line", KEY_LINE, 1).alias("query_topic"), F.regexp_extract("line", KEY_LINE, 2).alias("query"), "line"
        )
        ok = F.col("line").rlike(KEY_LINE)
    queries = parsed.filter(ok).select("query_topic", "query").dropDuplicates(["query_topic", "query"])
    malformed = parsed.filter(~ok).select("line")
    return queries, malformed


def _not_rollback(F: Any) -> Any:
    # index_keys.is_indexed as a Spark expression: the records an index would hold.
    return F.expr(f"(sys_flag & {SYSFLAG_TRANSACTION_MASK}) != {NOT_INDEXED_TRANSACTION}")


def match_keys(catalog: Any, queries: Any, max_num: int, begin: int, end: int) -> Any:
    """Key matches with rank (newest first) and the number of matches per query."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    cat = catalog.filter(_not_rollback(F))
    if begin:
        cat = cat.filter(F.col("store_timestamp") >= begin)
    if end:
        cat = cat.filter(F.col("store_timestamp") <= end)
    exploded = cat.select(*MESSAGE_COLUMNS, F.explode(F.array_distinct("keys")).alias("_key"))
    joined = exploded.join(queries, (exploded["topic"] == queries["query_topic"]) & (exploded["_key"] == queries["query"]))
    per_query = Window.partitionBy("query_topic", "query")
    ordered = per_query.orderBy(F.col("store_timestamp").desc(), F.col("broker").asc(), F.col("physical_offset").desc())
    ranked = joined.withColumn("rank", F.row_number().over(ordered)).withColumn("matches", F.count(F.lit(1)).over(per_query))
    if max_num:
        ranked = ranked.filter(F.col("rank") <= max_num)
    return ranked.withColumn("matched_by", F.lit("key"))


def match_unique_keys(catalog: Any, queries: Any, all_copies: bool) -> Any:
    """The offsetMsgId reading if the id is one (topic must agree), else the earliest copy + copies."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    direct = catalog.join(
        queries, (catalog["topic"] == queries["query_topic"]) & (catalog["offset_msg_id"] == F.upper(queries["query"]))
    ).select(*MESSAGE_COLUMNS, "query_topic", "query", F.lit(0).alias("_via"))
    by_uk = catalog.filter(_not_rollback(F)).join(
        queries, (catalog["topic"] == queries["query_topic"]) & (catalog["unique_key"] == queries["query"])
    ).select(*MESSAGE_COLUMNS, "query_topic", "query", F.lit(1).alias("_via"))
    both = direct.unionByName(by_uk)
    per_query = Window.partitionBy("query_topic", "query")
    both = both.withColumn("_best", F.min("_via").over(per_query)).filter(F.col("_via") == F.col("_best"))
    ordered = per_query.orderBy(F.col("store_timestamp").asc(), F.col("broker").asc(), F.col("physical_offset").asc())
    ranked = both.withColumn("rank", F.row_number().over(ordered)).withColumn("matches", F.count(F.lit(1)).over(per_query))
    if not all_copies:
        ranked = ranked.filter(F.col("rank") == 1)
    return ranked.withColumn("matched_by", F.when(F.col("_via") == 0, F.lit("offset_msg_id")).otherwise(F.lit("unique_key")))


def match_msg_ids(catalog: Any, queries: Any) -> Any:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    joined = catalog.join(queries, catalog["offset_msg_id"] == queries["query"]).select(*MESSAGE_COLUMNS, "query_topic", "query")
    per_query = Window.partitionBy("query")
    ordered = per_query.orderBy(F.col("broker").asc(), F.col("physical_offset").asc())
    ranked = joined.withColumn("rank", F.row_number().over(ordered)).withColumn("matches", F.count(F.lit(1)).over(per_query))
    return ranked.withColumn("matched_by", F.lit("offset_msg_id"))


def lookup_frame(catalog: Any, queries: Any, qtype: str, max_num: int = 0, all_copies: bool = False, begin: int = 0, end: int = 0) -> Any:
    """Every query with its matches (or one `found = false` row), in QUERY_COLUMNS + MESSAGE_COLUMNS."""
    from pyspark.sql import functions as F

    if qtype == "key":
        matched = match_keys(catalog, queries, max_num, begin, end)
    elif qtype == "unique-key":
        matched = match_unique_keys(catalog, queries, all_copies)
    else:
        matched = match_msg_ids(catalog, queries)
    matched = matched.select(*MESSAGE_COLUMNS, "rank", "matches", "matched_by", F.col("query_topic").alias("_mt"), F.col("query").alias("_mq"))
    q = queries.alias("q")
    cond = (F.col("q.query") == F.col("_mq")) & (F.col("q.query_topic").eqNullSafe(F.col("_mt")))
    out = q.join(matched, cond, "left")
    return out.select(
        F.lit(qtype).alias("query_type"),
        F.col("q.query_topic").alias("query_topic"),
        F.col("q.query").alias("query"),
        F.col("_mq").isNotNull().alias("found"),
        F.coalesce(F.col("matches"), F.lit(0)).cast("int").alias("matches"),
        F.col("rank").cast("int").alias("rank"),
        F.col("matched_by"),
        *MESSAGE_COLUMNS,
    )


def for_format(df: Any, fmt: str) -> Any:
    """CSV holds no arrays or maps: keys become space-separated text, properties JSON."""
    from pyspark.sql import functions as F

    if fmt != "csv":
        return df
    return df.withColumn("keys", F.concat_ws(" ", "keys")).withColumn("properties", F.to_json("properties"))


def load_catalog(ctx: JobContext) -> Any:
    args = ctx.args
    if args.catalog:
        ctx.spark.conf.set("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
        df = ctx.spark.read.parquet(args.catalog)
        missing = [c for c in MESSAGE_COLUMNS if c not in df.columns]
        if missing:
            raise JobError(f"--catalog {args.catalog}: not a catalog written by `export` (missing columns {', '.join(missing)})", usage=True)
        ctx.summary.inputs = [f"catalog {args.catalog}"]
        return df, None
    from quarry.pipeline.export import records_dataframe

    stores = open_inputs(args)
    ctx.summary.inputs = describe_inputs(stores)
    splits = plan_splits(ctx, stores)
    counters = ctx.counters()
    # Persisted: a unique-key lookup reads the catalog twice, the segments are read once.
    return records_dataframe(ctx, splits, False, counters).persist(), counters


def run_lookup(ctx: JobContext) -> None:

    args = ctx.args
    catalog, counters = load_catalog(ctx)
    queries, malformed = read_queries(ctx.spark, args.queries, args.type, args.topic)
    queries = queries.cache()
    result = lookup_frame(catalog, queries, args.type, args.max_num, args.all_copies, args.begin, args.end).cache()
    out = for_format(result, args.format)
    if args.single_file:
        out = out.coalesce(1)
    writer = out.write.mode("overwrite" if args.overwrite else "errorifexists")
    if args.format == "csv":
        writer = writer.option("header", "true")
    ctx.run_stage("join+write", counters, 0, lambda: getattr(writer, args.format)(args.out))
    per_query = result.select("query_topic", "query", "found").distinct().groupBy("found").count().collect()
    found_q = sum(r["count"] for r in per_query if r["found"])
    not_found_q = sum(r["count"] for r in per_query if not r["found"])
    rows = result.count()
    bad = malformed.count()
    bad_examples = [r["line"] for r in malformed.limit(3).collect()] if bad else []
    ctx.summary.records = counters.records.value if counters else 0
    ctx.summary.bytes = counters.bytes.value if counters else 0
    if counters:
        count, reports = counters.corrupt.value
        ctx.summary.corrupt, ctx.summary.corrupt_count = sorted(reports, key=lambda r: (r.broker, r.offset)), count
        if count:
            ctx.summary.skipped["corrupt records (not searched)"] = count
    if bad:
        ctx.summary.skipped[f"malformed query lines (e.g. {bad_examples[0]!r})"] = bad
    ctx.summary.output = args.out
    ctx.summary.files = sum(1 for _r, _d, names in os.walk(args.out) for n in names if n.startswith("part-"))
    ctx.summary.details.append(("queries", f"{found_q + not_found_q:,} {args.type} queries: {found_q:,} found, {not_found_q:,} not found; {rows:,} result rows ({args.format})"))
    queries.unpersist()
    result.unpersist()
