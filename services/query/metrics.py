"""The router's metrics (its own registry; see quarry.services.metrics). Those updated by every
query are loop metrics: changed on the router's event loop only, without prometheus_client's
lock and calls (five to seven updates a key query)."""
from __future__ import annotations

from quarry.services.metrics import ServiceMetrics

METRICS = ServiceMetrics("router")
QUERIES = METRICS.loop_counter("quarry_router_queries_total", "Queries by kind and outcome", ["kind", "outcome"])
QUERY_LATENCY = METRICS.loop_histogram("quarry_router_query_latency_seconds", "Query latency by kind", ["kind"])
FANOUT_LATENCY = METRICS.loop_histogram("quarry_router_fanout_latency_seconds", "Per-broker call latency in fan-outs", ["broker"])
KEY_FILTER_RULED_OUT = METRICS.loop_counter("quarry_router_key_filter_ruled_out_total", "Brokers not asked a key query: their key presence filter rules the key out", ["broker"])
FANOUT_FAILURES = METRICS.loop_counter("quarry_router_fanout_failures_total", "Per-broker failures in fan-outs", ["broker", "code"])
BROKERS = METRICS.gauge("quarry_router_brokers", "Registered brokers: live (heartbeating or static) and missing (stopped heartbeating, still reported)", ["state"])
