"""The commitlog's metrics (its own registry; see quarry.services.metrics)."""
from __future__ import annotations

from quarry.services.metrics import ServiceMetrics

METRICS = ServiceMetrics("commitlog")
# Updated by every send, on the event loop: loop metrics (quarry.services.metrics.LoopCounter).
SENT_MESSAGES = METRICS.loop_counter("quarry_commitlog_sent_messages_total", "Messages appended", ["topic"])
PULLED_MESSAGES = METRICS.loop_counter("quarry_commitlog_pulled_messages_total", "Messages handed to RocketMQ 4 consumers by PULL_MESSAGE")
SENT_BYTES = METRICS.loop_counter("quarry_commitlog_sent_bytes_total", "Record bytes appended")
SEND_LATENCY = METRICS.loop_histogram("quarry_commitlog_send_latency_seconds", "Append (and, in SYNC mode, fsync) time of a send, by RPC", ["rpc"])
SEND_ERRORS = METRICS.counter("quarry_commitlog_send_errors_total", "Rejected sends by error", ["code"])
FLUSH_SECONDS = METRICS.histogram("quarry_commitlog_flush_seconds", "Time of one fsync round (group commit)")
STORE_MAX_OFFSET = METRICS.gauge("quarry_commitlog_max_offset", "Physical offset one past the last record")  # read from the store at scrape
