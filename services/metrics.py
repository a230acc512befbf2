"""Prometheus metrics, one registry per service process (prometheus-client).

Each service builds its own `ServiceMetrics` (in `services/<service>/metrics.py`) and serves
only that registry on --metrics-port, so a router never exports an indexer's gauges. Every
service has the per-RPC metrics (filled by `call_tracking`); durations are in seconds.
Nothing here knows gRPC. Scrape example: docs/operations.md.
"""
from __future__ import annotations

import time
from bisect import bisect_left
from typing import Iterator

from prometheus_client import (
    GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, CollectorRegistry, Counter, Gauge, Histogram, start_http_server,
)
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from quarry.services.settings import StartupError, cannot_listen  # StartupError re-exported: the metrics port raises it

__all__ = ["LATENCY_BUCKETS", "HistogramSeries", "LoopCounter", "LoopHistogram", "ServiceMetrics", "StartupError"]

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class ServiceMetrics:
    """One service's registry: process metrics, per-RPC metrics, and whatever the service adds."""

    def __init__(self, service: str) -> None:
        self.service = service
        self.registry = CollectorRegistry()
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.registry.register(collector)
        # Updated on every call, on the event loop: loop metrics (see LoopCounter).
        self.rpc_requests = self.loop_counter("quarry_rpc_requests_total", "RPCs handled, by gRPC service, method and final status code", ["service", "method", "code"])
        self.rpc_seconds = self.loop_histogram("quarry_rpc_duration_seconds", "Time from the start of an RPC to its status, by gRPC service, method and status code", ["service", "method", "code"])
        self.in_flight = [0]  # RPCs being handled now, kept by call_tracking on the event loop
        self.rpc_in_flight = self.gauge("quarry_rpc_in_flight", "RPCs being handled now")
        self.rpc_in_flight.set_function(lambda: self.in_flight[0])

    def counter(self, name: str, doc: str, labels: list[str] | None = None) -> Counter:
        return Counter(name, doc, labels or [], registry=self.registry)

    def gauge(self, name: str, doc: str, labels: list[str] | None = None) -> Gauge:
        return Gauge(name, doc, labels or [], registry=self.registry)

    def histogram(self, name: str, doc: str, labels: list[str] | None = None) -> Histogram:
        return Histogram(name, doc, labels or [], buckets=LATENCY_BUCKETS, registry=self.registry)

    def loop_counter(self, name: str, doc: str, labels: list[str] | None = None) -> "LoopCounter":
        counter = LoopCounter(name, doc, labels or [])
        self.registry.register(counter)
        return counter

    def loop_histogram(self, name: str, doc: str, labels: list[str] | None = None) -> "LoopHistogram":
        histogram = LoopHistogram(name, doc, labels or [])
        self.registry.register(histogram)
        return histogram

    def serve(self, port: int, host: str = "0.0.0.0") -> None:
        """Serve /metrics on host:port, the service's own bind address (port 0: metrics off).
        A port that cannot be listened on is a StartupError naming the flag."""
        if not port:
            return
        try:
            start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise cannot_listen("--metrics-port", f"{host}:{port}", exc.strerror or str(exc)) from None


class LoopCounter(Collector):
    """A counter for the per-call path, updated by one thread (the service's event loop) only:
    each labelled series is a list whose first element the caller adds to (`series[0] += n`),
    without the lock and the three calls of prometheus_client's `inc` (several microseconds a
    call in a serving process, where every Python step costs more than in a tight loop). Scrapes
    read the numbers as they are, with the `_created` sample prometheus_client's Counter gives."""

    def __init__(self, name: str, doc: str, labels: list[str]) -> None:
        self.name, self.doc, self.label_names = name, doc, labels
        self._series: dict[tuple[str, ...], list[float]] = {}

    def labels(self, *values: str) -> list[float]:
        series = self._series.get(values)
        if series is None:
            series = self._series[values] = [0.0, time.time()]  # value, created
        return series

    def total(self) -> float:
        """The sum of every series (a broker's runtime figures)."""
        return sum(series[0] for series in self._series.copy().values())

    def describe(self) -> Iterator[Metric]:
        # The registry learns the names from this: it refuses a duplicate, and a scrape that
        # asks for some names (?name[]=) finds these.
        yield CounterMetricFamily(self.name, self.doc, labels=self.label_names)

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.doc, labels=self.label_names)
        for values, series in self._series.copy().items():  # (one C call: the loop may add a series meanwhile)
            family.add_metric(list(values), series[0], created=series[1])
        yield family


class LoopHistogram(Collector):
    """A histogram for the per-call path, with LoopCounter's rule (one updating thread, no
    lock): `labels(...)` gives a series whose `observe` adds to one bucket and the sum."""

    def __init__(self, name: str, doc: str, labels: list[str], buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.name, self.doc, self.label_names, self.bounds = name, doc, labels, buckets
        self._series: dict[tuple[str, ...], HistogramSeries] = {}

    def labels(self, *values: str) -> "HistogramSeries":
        series = self._series.get(values)
        if series is None:
            series = self._series[values] = HistogramSeries(self.bounds)
        return series

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self.name, self.doc, labels=self.label_names)

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.doc, labels=self.label_names)
        for values, series in self._series.copy().items():
            counts, total = list(series.counts), series.sum
            cumulative, buckets = 0.0, []
            for bound, count in zip((*self.bounds, float("inf")), counts):
                cumulative += count
                buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), cumulative))
            family.add_metric(list(values), buckets, total)
            family.add_sample(f"{self.name}_created", dict(zip(self.label_names, values)), series.created)
        yield family


class HistogramSeries:
    """One labelled series of a LoopHistogram: a count per bucket (the last is +Inf) and the sum."""

    __slots__ = ("bounds", "counts", "sum", "created")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # the first bucket whose bound is >= value
        self.sum += value

