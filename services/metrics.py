"""Prometheus metrics, one registry per service process (prometheus-client).

Each service builds its own `ServiceMetrics` (in `services/<service>/metrics.py`) and serves
only that registry on --metrics-port, so a router never exports an indexer's gauges. Every
service has the per-RPC metrics (filled by `call_tracking`); durations are in seconds.
Nothing here knows gRPC. Scrape example: docs/operations.md.
"""
from __future__ import annotations

from prometheus_client import (
    GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, CollectorRegistry, Counter, Gauge, Histogram, start_http_server,
)

from quarry.services.settings import StartupError  # re-exported: the metrics port raises it

__all__ = ["LATENCY_BUCKETS", "ServiceMetrics", "StartupError"]

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class ServiceMetrics:
    """One service's registry: process metrics, per-RPC metrics, and whatever the service adds."""

    def __init__(self, service: str) -> None:
        self.service = service
        self.registry = CollectorRegistry()
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.registry.register(collector)
        self.rpc_requests = self.counter("quarry_rpc_requests_total", "RPCs handled, by gRPC service, method and final status code", ["service", "method", "code"])
        self.rpc_seconds = self.histogram("quarry_rpc_duration_seconds", "Time from the start of an RPC to its status, by gRPC service, method and status code", ["service", "method", "code"])
        self.rpc_in_flight = self.gauge("quarry_rpc_in_flight", "RPCs being handled now")

    def counter(self, name: str, doc: str, labels: list[str] | None = None) -> Counter:
        return Counter(name, doc, labels or [], registry=self.registry)

    def gauge(self, name: str, doc: str, labels: list[str] | None = None) -> Gauge:
        return Gauge(name, doc, labels or [], registry=self.registry)

    def histogram(self, name: str, doc: str, labels: list[str] | None = None) -> Histogram:
        return Histogram(name, doc, labels or [], buckets=LATENCY_BUCKETS, registry=self.registry)

    def serve(self, port: int, host: str = "0.0.0.0") -> None:
        """Serve /metrics on host:port, the service's own bind address (port 0: metrics off).
        A port that cannot be listened on is a StartupError naming the flag."""
        if not port:
            return
        try:
            start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise StartupError(f"--metrics-port [env QUARRY_METRICS_PORT]: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
