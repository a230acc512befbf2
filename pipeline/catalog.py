"""The message catalog: its Spark schema and how a decoded record becomes a row.

Partitioned by `broker`, `topic` and `store_date` (the UTC date of STORETIMESTAMP,
yyyy-MM-dd). Hosts are `ip:port` text; keys are the KEYS tokens (split on spaces, empty
tokens dropped); properties are the map RocketMQ's reader sees (empty names and values
dropped, last wins). `body` is present only when exported with `--with-body`.
"""
from __future__ import annotations

import datetime as _dt
from typing import Any

from quarry.formats.body import readable_body
from quarry.formats.record import Record

PARTITION_COLUMNS = ("broker", "topic", "store_date")

# (name, spark type name, nullable) in catalog order; body last and optional.
COLUMNS: tuple[tuple[str, str, bool], ...] = (
    ("broker", "string", False),
    ("topic", "string", False),
    ("queue_id", "int", False),
    ("queue_offset", "long", False),
    ("physical_offset", "long", False),
    ("store_size", "int", False),
    ("offset_msg_id", "string", False),
    ("unique_key", "string", True),
    ("keys", "array<string>", False),
    ("tags", "string", True),
    ("store_timestamp", "long", False),
    ("born_timestamp", "long", False),
    ("store_host", "string", False),
    ("born_host", "string", False),
    ("sys_flag", "int", False),
    ("flag", "int", False),
    ("reconsume_times", "int", False),
    ("prepared_transaction_offset", "long", False),
    ("body_size", "int", False),
    ("body_crc", "int", False),
    ("properties", "map<string,string>", False),
    ("store_date", "string", False),
)
BODY_COLUMN = ("body", "binary", True)


def schema(with_body: bool) -> Any:
    """The catalog's StructType (the order rows are built in)."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        MapType,
        StringType,
        StructField,
        StructType,
    )

    simple = {"string": StringType(), "int": IntegerType(), "long": LongType(), "binary": BinaryType()}
    types = {**simple, "array<string>": ArrayType(StringType(), False), "map<string,string>": MapType(StringType(), StringType(), False)}
    cols = list(COLUMNS) + ([BODY_COLUMN] if with_body else [])
    return StructType([StructField(name, types[t], nullable) for name, t, nullable in cols])


def column_names(with_body: bool) -> list[str]:
    return [c[0] for c in COLUMNS] + (["body"] if with_body else [])


_DAY_MS = 86_400_000
_EPOCH = _dt.date(1970, 1, 1)
_dates: dict[int, str] = {}


def store_date(store_timestamp_ms: int) -> str:
    """UTC date of a store timestamp, yyyy-MM-dd (the partition value)."""
    day = store_timestamp_ms // _DAY_MS
    text = _dates.get(day)
    if text is None:
        text = (_EPOCH + _dt.timedelta(days=day)).isoformat()
        if len(_dates) < 4096:
            _dates[day] = text
    return text


def host_text(host: tuple[str, int]) -> str:
    """`ip:port`, with the IPv6 address in brackets: `[2001:db8:0:0:0:0:0:1]:50000`."""
    ip, port = host
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def row(rec: Record, broker: str, with_body: bool) -> tuple[Any, ...]:
    """A catalog row (tuple in `column_names` order) from a decoded record."""
    values = (
        broker,
        rec.topic,
        rec.queue_id,
        rec.queue_offset,
        rec.physical_offset,
        rec.store_size,
        rec.offset_msg_id,
        rec.unique_key,
        rec.keys,
        rec.tags,
        rec.store_timestamp,
        rec.born_timestamp,
        host_text(rec.store_host),
        host_text(rec.born_host),
        rec.sys_flag,
        rec.flag,
        rec.reconsume_times,
        rec.prepared_transaction_offset,
        len(rec.body),
        rec.body_crc,
        rec.properties,
        store_date(rec.store_timestamp),
    )
    # The body as a reader gets it (inflated when stored zlib-compressed); size and CRC are the record's.
    return values + (readable_body(rec.body, rec.sys_flag),) if with_body else values
