"""Prometheus metrics of every Quarry service (prometheus-client), served on --metrics-port.

The servers call these objects; nothing here knows gRPC. Scrape example: docs/operations.md.
"""
from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

# commitlog
SENT_MESSAGES = Counter("quarry_commitlog_sent_messages_total", "Messages appended", ["topic"])
SENT_BYTES = Counter("quarry_commitlog_sent_bytes_total", "Record bytes appended")
SEND_LATENCY = Histogram("quarry_commitlog_send_latency_seconds", "Send RPC latency (SendMessage, SendBatch)", ["rpc"], buckets=_LATENCY_BUCKETS)
SEND_ERRORS = Counter("quarry_commitlog_send_errors_total", "Rejected sends by status code", ["code"])
FLUSH_SECONDS = Histogram("quarry_commitlog_flush_seconds", "Time of one fsync round (group commit)", buckets=_LATENCY_BUCKETS)
STORE_MAX_OFFSET = Gauge("quarry_commitlog_max_offset", "Physical offset one past the last record")

# indexer
INDEX_ENTRIES = Counter("quarry_indexer_entries_total", "IndexFile entries written")
INDEX_LAG_BYTES = Gauge("quarry_indexer_lag_bytes", "Commitlog bytes not yet indexed")
INDEX_LAG_MS = Gauge("quarry_indexer_lag_ms", "Milliseconds between now and the store time of the last indexed record, while behind")

# router
QUERIES = Counter("quarry_router_queries_total", "Queries by kind and outcome", ["kind", "outcome"])
QUERY_LATENCY = Histogram("quarry_router_query_latency_seconds", "Query latency by kind", ["kind"], buckets=_LATENCY_BUCKETS)
FANOUT_LATENCY = Histogram("quarry_router_fanout_latency_seconds", "Per-broker call latency in fan-outs", ["broker"], buckets=_LATENCY_BUCKETS)
FANOUT_FAILURES = Counter("quarry_router_fanout_failures_total", "Per-broker failures in fan-outs", ["broker", "code"])


def start_metrics_server(port: int, host: str = "0.0.0.0") -> None:
    """Serve /metrics on host:port — the service's own bind address (port 0: metrics off)."""
    if port:
        start_http_server(port, addr=host)
