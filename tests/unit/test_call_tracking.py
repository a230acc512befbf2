"""Call tracking (services/call_tracking.py) and the loop metrics it fills (services/metrics.py): the per-call counters and histograms read as
prometheus_client's own would at a scrape, and the call tracker's counts."""
from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator

import pytest

from quarry.services.call_tracking import CallTracker
from quarry.services.metrics import LATENCY_BUCKETS, ServiceMetrics


def test_a_loop_counter_exports_each_series_as_a_counter() -> None:
    m = ServiceMetrics("test")
    sent = m.loop_counter("quarry_test_sent_total", "sent", ["topic"])
    sent.labels("A")[0] += 2
    sent.labels("A")[0] += 1
    sent.labels("B")[0] += 5
    assert m.registry.get_sample_value("quarry_test_sent_total", {"topic": "A"}) == 3
    assert m.registry.get_sample_value("quarry_test_sent_total", {"topic": "B"}) == 5
    assert m.registry.get_sample_value("quarry_test_sent_total", {"topic": "C"}) is None


@pytest.mark.parametrize("value", [0.0, LATENCY_BUCKETS[0], LATENCY_BUCKETS[0] * 1.01, LATENCY_BUCKETS[-1], LATENCY_BUCKETS[-1] * 2])
def test_a_loop_histogram_buckets_as_prometheus_does(value: float) -> None:
    """A value equal to a bound is in that bound's bucket (le is inclusive); buckets are cumulative."""
    m = ServiceMetrics("test")
    mine = m.loop_histogram("quarry_test_seconds", "mine", ["rpc"])
    theirs = m.histogram("quarry_test_reference_seconds", "prometheus_client's", ["rpc"])
    for v in (value, value, 0.003):
        mine.labels("Send").observe(v)
        theirs.labels("Send").observe(v)
    for bound in (*[repr(float(b)) for b in LATENCY_BUCKETS], "+Inf"):
        got = m.registry.get_sample_value("quarry_test_seconds_bucket", {"rpc": "Send", "le": bound})
        assert got == m.registry.get_sample_value("quarry_test_reference_seconds_bucket", {"rpc": "Send", "le": bound}), bound
    for suffix in ("_count", "_sum"):
        assert m.registry.get_sample_value(f"quarry_test_seconds{suffix}", {"rpc": "Send"}) == pytest.approx(
            m.registry.get_sample_value(f"quarry_test_reference_seconds{suffix}", {"rpc": "Send"}))


def test_the_tracker_counts_calls_in_flight_and_their_outcome() -> None:
    m = ServiceMetrics("test")
    tracker = CallTracker(m)
    other = CallTracker(m)  # a second server of the same service shares its metrics
    a = tracker.begin("/quarry.v1.CommitLogService/SendMessage")
    b = other.begin("/quarry.v1.CommitLogService/SendMessage")
    health = tracker.begin("/grpc.health.v1.Health/Watch")  # counted, not waited for
    assert m.registry.get_sample_value("quarry_rpc_in_flight") == 3
    assert tracker.in_flight == 1 and not tracker.wait_idle(0)
    tracker.end(a, "OK")
    assert tracker.wait_idle(0) and not other.wait_idle(0)
    other.end(b, "INVALID_ARGUMENT")
    tracker.end(health, "CANCELLED")
    assert m.registry.get_sample_value("quarry_rpc_in_flight") == 0
    labels = {"service": "quarry.v1.CommitLogService", "method": "SendMessage"}
    assert m.registry.get_sample_value("quarry_rpc_requests_total", {**labels, "code": "OK"}) == 1
    assert m.registry.get_sample_value("quarry_rpc_requests_total", {**labels, "code": "INVALID_ARGUMENT"}) == 1
    assert m.registry.get_sample_value("quarry_rpc_duration_seconds_count", {**labels, "code": "OK"}) == 1
    assert m.registry.get_sample_value("quarry_rpc_requests_total", {"service": "grpc.health.v1.Health", "method": "Watch", "code": "CANCELLED"}) == 1


def test_a_scrape_from_another_thread_reads_the_loop_metrics() -> None:
    """The HTTP exporter scrapes on its own thread while the loop updates and adds series: every
    scrape reads, none fails, and what each sees only grows."""
    from prometheus_client.exposition import generate_latest

    m = ServiceMetrics("test")
    tracker = CallTracker(m)
    calls = 3000

    async def loop_side() -> None:
        for i in range(calls):
            tracker.end(tracker.begin(f"/s.S/M{i % 300}"), "OK")  # new series all along the way
            if i % 10 == 0:
                await asyncio.sleep(0)  # let the scraping thread run between calls

    def requests_seen() -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in generate_latest(m.registry).decode().splitlines()
                   if line.startswith("quarry_rpc_requests_total{"))

    async def main() -> list[float]:
        seen: list[float] = []

        def scrape() -> None:
            for _ in range(40):
                seen.append(requests_seen())

        await asyncio.gather(loop_side(), asyncio.to_thread(scrape))
        return seen

    seen = asyncio.run(main())
    assert len(seen) == 40 and seen == sorted(seen)
    assert requests_seen() == calls


def test_loop_metrics_are_named_to_the_registry_and_carry_created_samples() -> None:
    """As prometheus_client's own: a second metric of the same name is refused, a scrape that
    asks for names finds them, and each series has its `_created` sample."""
    from prometheus_client.exposition import generate_latest

    m = ServiceMetrics("test")
    with pytest.raises(ValueError):
        m.loop_counter("quarry_rpc_requests_total", "again")
    with pytest.raises(ValueError):
        m.loop_histogram("quarry_rpc_duration_seconds", "again")
    tracker = CallTracker(m)
    tracker.end(tracker.begin("/s.S/M"), "OK")
    labels = {"service": "s.S", "method": "M", "code": "OK"}
    assert m.registry.get_sample_value("quarry_rpc_requests_created", labels) is not None
    assert m.registry.get_sample_value("quarry_rpc_duration_seconds_created", labels) is not None
    named = generate_latest(m.registry.restricted_registry(["quarry_rpc_requests_total", "quarry_rpc_duration_seconds_count"])).decode()
    assert 'quarry_rpc_requests_total{code="OK",method="M",service="s.S"} 1.0' in named
    assert 'quarry_rpc_duration_seconds_count{code="OK",method="M",service="s.S"} 1.0' in named


@contextlib.asynccontextmanager
async def _tracked(tracker: CallTracker, handlers: dict[str, Any]) -> AsyncIterator[Any]:
    """A grpc.aio server whose service t.T has `handlers`, tracked by `tracker`; yields a channel to it."""
    import grpc

    from quarry.services.call_tracking import TrackedServer

    server = grpc.aio.server()
    TrackedServer(server, tracker).add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.T", handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield channel
    finally:
        await server.stop(None)


def test_a_tracked_call_leaves_no_reference_cycle_holding_its_grpc_state() -> None:
    """A call's core objects go with the call (reference counting), not at the next collection:
    each one the collector had to free kept a finished call's gRPC state alive meanwhile."""
    import gc

    import grpc

    async def main() -> tuple[int, int]:
        async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            return request

        metrics = ServiceMetrics("test")
        async with _tracked(CallTracker(metrics), {"Echo": grpc.unary_unary_rpc_method_handler(echo)}) as channel:
            call = channel.unary_unary("/t.T/Echo")
            gc.collect()
            gc.disable()
            try:
                for _ in range(200):
                    assert await call(b"x") == b"x"
                alive = sum(1 for o in gc.get_objects() if type(o).__name__ == "_ServicerContext")
            finally:
                gc.enable()
        ok = metrics.registry.get_sample_value("quarry_rpc_requests_total", {"service": "t.T", "method": "Echo", "code": "OK"})
        return alive, int(ok or 0)

    alive, ok = asyncio.run(main())
    assert ok == 200  # every call tracked to its end
    assert alive < 5  # (the one being answered, at most)


def test_a_call_its_client_cancels_is_counted_as_cancelled() -> None:
    import grpc

    async def main() -> float | None:
        started = asyncio.Event()

        async def wait_forever(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            started.set()
            await asyncio.Event().wait()  # until cancelled
            return b""

        metrics = ServiceMetrics("test")
        async with _tracked(CallTracker(metrics), {"Wait": grpc.unary_unary_rpc_method_handler(wait_forever)}) as channel:
            call = channel.unary_unary("/t.T/Wait")(b"x")
            await asyncio.wait_for(started.wait(), 10)
            call.cancel()
            deadline = asyncio.get_running_loop().time() + 10
            while metrics.in_flight[0] and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.01)  # (a poll of the condition, with a deadline)
        return metrics.registry.get_sample_value("quarry_rpc_requests_total", {"service": "t.T", "method": "Wait", "code": "CANCELLED"})

    assert asyncio.run(main()) == 1


def test_unary_calls_in_flight_are_counted_and_streams_are_not() -> None:
    """What SendPath.append_in_turn asks (services/commitlog/main.py wires it): whether a call
    has company. Two unary calls held in their handlers count two; a response stream held open
    beside them counts nothing; all back to zero when they end."""
    import grpc

    async def main() -> tuple[int, int, int]:
        release = asyncio.Event()
        held = asyncio.Semaphore(0)

        async def hold(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            held.release()
            await release.wait()
            return request

        async def stream(request: bytes, context: grpc.aio.ServicerContext):  # type: ignore[no-untyped-def]
            held.release()
            await release.wait()
            yield request

        tracker = CallTracker(ServiceMetrics("test"))
        handlers = {"Hold": grpc.unary_unary_rpc_method_handler(hold), "Stream": grpc.unary_stream_rpc_method_handler(stream)}
        async with _tracked(tracker, handlers) as channel:
            streamed = channel.unary_stream("/t.T/Stream")(b"s")
            await asyncio.wait_for(held.acquire(), 10)
            only_stream = tracker.unary_in_flight
            calls = [asyncio.ensure_future(channel.unary_unary("/t.T/Hold")(b"x")) for _ in range(2)]
            for _ in calls:
                await asyncio.wait_for(held.acquire(), 10)
            both = tracker.unary_in_flight
            release.set()
            assert await asyncio.gather(*calls) == [b"x", b"x"]
            assert [r async for r in streamed] == [b"s"]
            deadline = asyncio.get_running_loop().time() + 10
            while tracker.unary_in_flight and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.01)  # (a poll of the condition, with a deadline: a call ends after its status is sent)
            return only_stream, both, tracker.unary_in_flight

    assert asyncio.run(main()) == (0, 2, 0)
