"""One-line-per-event structured logging for every Quarry process.

QUARRY_LOG_FORMAT=kv (default) prints `ts=… level=… logger=… event=… key=value`;
QUARRY_LOG_FORMAT=json prints one JSON object per line. QUARRY_LOG_LEVEL sets the level.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any


class _KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = _fields(record)
        return " ".join(f"{k}={_kv(v)}" for k, v in fields.items())


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_fields(record), default=str)


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
        "level": record.levelname.lower(),
        "logger": record.name,
        "event": record.getMessage(),
    }
    fields.update(getattr(record, "kv", {}))
    if record.exc_info:
        fields["exc"] = logging.Formatter().formatException(record.exc_info).replace("\n", " | ")
    return fields


def _kv(value: Any) -> str:
    text = str(value)
    if not text or any(c in text for c in ' "='):
        return json.dumps(text)
    return text


def configure_logging() -> None:
    """Install the one-line formatter on the root logger (idempotent)."""
    root = logging.getLogger()
    fmt = os.environ.get("QUARRY_LOG_FORMAT", "kv").lower()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if fmt == "json" else _KeyValueFormatter())
    root.handlers[:] = [handler]
    root.setLevel(os.environ.get("QUARRY_LOG_LEVEL", "INFO").upper())


def log_event(logger: logging.Logger, event: str, level: int = logging.INFO, **kv: Any) -> None:
    """Log one event with key=value fields."""
    logger.log(level, event, extra={"kv": kv})
