"""One-line-per-event structured logging for every Quarry process.

--log-format kv (default; env QUARRY_LOG_FORMAT) prints `ts=… level=… logger=… event=… key=value`,
json prints one JSON object per line; --log-level (QUARRY_LOG_LEVEL) sets the level. A value
holding a space, quote, `=` or any unprintable character (newline, tab, …) is written as a JSON
string, so an event never spans two lines whatever an error message or a peer sends; uncaught
exceptions (main thread and others) and warnings are logged as events too, not as tracebacks.
"""
from __future__ import annotations

import json
import logging
import sys
import threading
import time
from typing import Any, Callable


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
    if not text or any(c in ' "=' or not c.isprintable() for c in text):
        return json.dumps(text)
    return text


def configure_logging(fmt: str = "kv", level: str = "INFO") -> None:
    """Install the one-line formatter on the root logger (idempotent). `fmt` and `level` come
    from the service's settings (--log-format, --log-level), validated there."""
    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if fmt == "json" else _KeyValueFormatter())
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.captureWarnings(True)
    crash = logging.getLogger("quarry.crash")

    def _uncaught(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        crash.critical("uncaught exception", exc_info=(exc_type, exc, tb))

    def _uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:
            return
        thread = args.thread.name if args.thread is not None else "?"
        crash.error("uncaught exception in thread", exc_info=(args.exc_type, args.exc_value, args.exc_traceback),  # type: ignore[arg-type]
                    extra={"kv": {"thread": thread}})

    sys.excepthook = _uncaught
    threading.excepthook = _uncaught_in_thread


def log_event(logger: logging.Logger, event: str, level: int = logging.INFO, **kv: Any) -> None:
    """Log one event with key=value fields."""
    logger.log(level, event, extra={"kv": kv})


class FailureReport:
    """The state of a step a background thread repeats (flush, follow a writer's files): a
    failure is logged when it starts and the recovery when it ends, not on every round, and
    `failing` holds the current error for health checks ("" while the step works)."""

    def __init__(self, logger: logging.Logger, failed: str, recovered: str) -> None:
        self.logger, self.failed, self.recovered = logger, failed, recovered
        self.failing = ""

    def run(self, step: Callable[[], Any]) -> bool:
        """Run one round of the step; never raises. True when it succeeded."""
        try:
            step()
        except Exception as exc:  # the thread must live on: its next round may succeed
            if not self.failing:
                log_event(self.logger, self.failed, logging.ERROR, error=repr(exc))
            self.failing = repr(exc)
            return False
        if self.failing:
            log_event(self.logger, self.recovered, previous_error=self.failing)
        self.failing = ""
        return True
