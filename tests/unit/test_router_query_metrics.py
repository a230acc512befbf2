"""The router's per-broker fan-out metrics count calls made: a broker ruled out by its key
presence filter is counted as such, not as a call that took no time."""
from __future__ import annotations

import asyncio

from quarry.services.query import metrics
from quarry.services.query.fanout import Outcome
from quarry.services.query.queries import Answer, Scan
from quarry.services.query.doors.quarry_v1 import _run


def _value(metric: object, name: str, **labels: str) -> float:
    for family in metric.collect():  # type: ignore[attr-defined]
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


def test_a_ruled_out_broker_is_counted_as_ruled_out_not_as_a_call() -> None:
    asked, skipped = "metrics-asked", "metrics-skipped"
    before = {b: _value(metrics.FANOUT_LATENCY, "quarry_router_fanout_latency_seconds_count", broker=b) for b in (asked, skipped)}
    ruled = _value(metrics.KEY_FILTER_RULED_OUT, "quarry_router_key_filter_ruled_out_total", broker=skipped)

    async def answer() -> Answer:
        return Answer(outcomes=[Outcome(key=asked, value=Scan(), latency_ms=3, attempts=1), Outcome(key=skipped, value=Scan(), ruled_out=True)])

    asyncio.run(_run("key", answer()))
    assert _value(metrics.FANOUT_LATENCY, "quarry_router_fanout_latency_seconds_count", broker=asked) == before[asked] + 1
    assert _value(metrics.FANOUT_LATENCY, "quarry_router_fanout_latency_seconds_count", broker=skipped) == before[skipped]
    assert _value(metrics.KEY_FILTER_RULED_OUT, "quarry_router_key_filter_ruled_out_total", broker=skipped) == ruled + 1
