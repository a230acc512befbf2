"""Every call a server handles, counted: in flight, and by method and final status.

Two uses, one interceptor. Shutdown waits for the calls in flight (not for the grace period:
grpc's `stop(grace)` waits the whole grace while any client merely holds an idle
connection), and the service's metrics get a count and a latency histogram per method and
status code (`quarry_rpc_requests_total`, `quarry_rpc_duration_seconds`).

Health checks, reflection and other open services are counted in the metrics but not
waited for: a Health.Watch stream lasts as long as its client wants.
"""
from __future__ import annotations

import asyncio
import functools
import threading
import time
from typing import Any, Callable, Sequence

import grpc

from quarry.services.metrics import HistogramSeries, ServiceMetrics

# Long-lived streams a client keeps open while it lives: cancelled at stop, not waited for.
_NOT_WAITED = ("/grpc.health.v1.Health/", "/grpc.reflection.", "/apache.rocketmq.v2.MessagingService/Telemetry")
# Bounds the per-method caches below: the methods a server registers, plus room for the
# handlers an ACL interceptor makes per refused call (past the bound they are not cached).
_CACHE_LIMIT = 1024
_BY_NUMBER = {c.value[0]: c for c in grpc.StatusCode}  # grpc.aio's context may give a code as its number


@functools.lru_cache(maxsize=_CACHE_LIMIT)
def _split(method: str) -> tuple[str, str]:
    """'/pkg.Service/Method' → ('pkg.Service', 'Method')."""
    service, _, name = method.lstrip("/").rpartition("/")
    return service or "unknown", name or method


def _code_name(context: Any, failed: bool | None) -> str:
    """The status a call ended with; `failed` None: its handler was cancelled (the client went
    away, or its deadline passed)."""
    code = context.code() if hasattr(context, "code") else None
    if isinstance(code, int):
        code = _BY_NUMBER.get(code)
    if code is None:
        return "CANCELLED" if failed is None else "UNKNOWN" if failed else "OK"
    return code.name  # type: ignore[no-any-return]


class CallTracker:
    """Counts calls in flight and records their outcome in the service's metrics.

    `begin` and `end` run on the service's event loop (every server here is grpc.aio; a
    done callback runs there too), so the counts are plain integers and the per-call metrics
    loop metrics (services/metrics.py): a lock or a prometheus_client update per step cost
    measurably more CPU per call. Only `wait_idle` is for other threads."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        self.metrics = metrics
        self._waited = 0
        # Unary calls between their handler's start and their end: whether a call has company.
        self.unary_in_flight = 0
        self._idle = threading.Event()
        self._idle.set()
        # Whether stop waits for a method's calls, and the labelled series of the per-RPC
        # metrics by (method, code), resolved once each.
        self._waited_methods: dict[str, bool] = {}
        self._series: dict[tuple[str, str], tuple[list[float], HistogramSeries]] = {}

    def begin(self, method: str) -> tuple[str, bool, float]:
        waited = self._waited_methods.get(method)
        if waited is None:
            waited = not method.startswith(_NOT_WAITED)
            if len(self._waited_methods) < _CACHE_LIMIT:
                self._waited_methods[method] = waited
        self.metrics.in_flight[0] += 1
        if waited:
            self._waited += 1
            if self._waited == 1:  # was idle (an Event's clear takes its own lock: not on every call)
                self._idle.clear()
        return method, waited, time.perf_counter()

    def end(self, token: tuple[str, bool, float], code: str) -> None:
        method, waited, t0 = token
        self.metrics.in_flight[0] -= 1
        series = self._series.get((method, code))
        if series is None:
            service, name = _split(method)
            series = (self.metrics.rpc_requests.labels(service, name, code), self.metrics.rpc_seconds.labels(service, name, code))
            if len(self._series) < _CACHE_LIMIT:
                self._series[(method, code)] = series
        series[0][0] += 1
        series[1].observe(time.perf_counter() - t0)
        if waited:
            self._waited -= 1
            if self._waited == 0:
                self._idle.set()

    @property
    def in_flight(self) -> int:
        return self._waited

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until no call that shutdown waits for is in flight; False at the timeout."""
        return self._idle.wait(timeout_s)


class _Call:
    """One tracked call: ended once, when gRPC says the RPC terminated (its status sent, or the
    client gone), not when the handler returns: the response is still being sent then, and a
    stop that went ahead at that moment would cancel it."""

    __slots__ = ("tracker", "token", "code", "_ended", "_unary")

    def __init__(self, tracker: CallTracker, method: str, unary: bool) -> None:
        self.tracker = tracker
        self.token = tracker.begin(method)
        self.code = "CANCELLED"  # what the call ends as if it terminates before its handler finishes
        self._ended = False
        self._unary = unary
        if unary:
            tracker.unary_in_flight += 1

    def finish(self, context: Any, failed: bool | None) -> None:
        """The handler is done: remember the status it leaves."""
        self.code = _code_name(context, failed)

    def end(self, *_: Any) -> None:
        if self._ended:  # (on the loop, like every step of a call: no lock)
            return
        self._ended = True
        if self._unary:
            self.tracker.unary_in_flight -= 1
        self.tracker.end(self.token, self.code)


def tracked_handler(tracker: CallTracker, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """`handler` (coroutine or async-generator behaviour) with every call of it tracked."""

    def start(context: grpc.aio.ServicerContext, unary: bool) -> _Call:
        """The call tracked (`unary`: one request, one response, counted in unary_in_flight)."""
        call = _Call(tracker, method, unary)
        # The call's own task (grpc.aio runs each RPC in one) ends once its status is sent.
        # Not context.add_done_callback: grpc binds the context into the callback it keeps in
        # the call's state, a reference cycle per call that kept the call's core objects alive
        # until the garbage collector ran (docs/decisions/per-call-overheads.md).
        task = asyncio.current_task()
        if task is not None:
            task.add_done_callback(call.end)
        else:
            context.add_done_callback(call.end)
        return call

    def unary(inner: Callable, single: bool) -> Callable:
        async def run(request: Any, context: grpc.aio.ServicerContext) -> Any:
            call = start(context, single)
            failed: bool | None = True  # None: cancelled
            try:
                result = await inner(request, context)
                failed = False
                return result
            except asyncio.CancelledError:
                failed = None
                raise
            finally:
                call.finish(context, failed)
        return run

    def streaming(inner: Callable) -> Callable:
        async def run(request: Any, context: grpc.aio.ServicerContext) -> Any:
            call = start(context, False)
            failed: bool | None = True  # None: cancelled
            try:
                result = inner(request, context)
                if hasattr(result, "__aiter__"):
                    async for item in result:
                        yield item
                else:  # a handler may also write with context.write and return a coroutine
                    await result
                failed = False
            except asyncio.CancelledError:
                failed = None
                raise
            finally:
                call.finish(context, failed)
        return run

    return _rewrap(handler, unary, streaming)


class TrackedServer:
    """An asyncio server as the registrations see it: every method handler they add is tracked,
    wrapped once as it is added. Without any interceptor grpc.aio finds a call's handler in
    its own code; an interceptor made every call also run its intercept_service coroutine and
    the continuation, a measurable share of a single send (docs/decisions/per-call-overheads.md)."""

    def __init__(self, server: grpc.aio.Server, tracker: CallTracker) -> None:
        self._server = server
        self.tracker = tracker

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers(tuple(_TrackedGenericHandler(h, self.tracker) for h in handlers))

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self._server.add_registered_method_handlers(  # type: ignore[attr-defined]
            service, {name: tracked_handler(self.tracker, f"/{service}/{name}", h) for name, h in handlers.items()})

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)  # ports, start, stop: the server's own


class _TrackedGenericHandler(grpc.GenericRpcHandler):
    """A generic handler whose method handlers come back tracked (each wrapped once)."""

    def __init__(self, inner: grpc.GenericRpcHandler, tracker: CallTracker) -> None:
        self._inner = inner
        self._tracker = tracker
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = self._inner.service(details)
        if handler is None:
            return None
        method = details.method
        known = self._wrapped.get(method)
        if known is None or known[0] is not handler:
            known = (handler, tracked_handler(self._tracker, method, handler))
            if len(self._wrapped) < _CACHE_LIMIT:
                self._wrapped[method] = known
        return known[1]


class AioTrackingInterceptor(grpc.aio.ServerInterceptor):
    """CallTracker as an interceptor, for a server that has interceptors anyway (ACL on): first
    in the chain, it also counts the calls the ACL refuses. The tracked wrapper of a handler is
    built once and reused."""

    def __init__(self, tracker: CallTracker) -> None:
        self.tracker = tracker
        self._wrapped: dict[tuple[str, grpc.RpcMethodHandler], grpc.RpcMethodHandler] = {}

    async def intercept_service(self, continuation: Callable, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler
        key = (details.method, handler)
        try:
            wrapped = self._wrapped.get(key)
        except TypeError:  # a handler holding something unhashable: wrap it for this call only
            return tracked_handler(self.tracker, details.method, handler)
        if wrapped is None:
            wrapped = tracked_handler(self.tracker, details.method, handler)
            if len(self._wrapped) < _CACHE_LIMIT:
                self._wrapped[key] = wrapped
        return wrapped


def _rewrap(handler: grpc.RpcMethodHandler, unary: Callable, streaming: Callable) -> grpc.RpcMethodHandler:
    """The same handler with its behaviour wrapped (unary responses by `unary`, told whether the
    request is single too, streamed by `streaming`)."""
    des, ser = handler.request_deserializer, handler.response_serializer
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(unary(handler.unary_unary, True), des, ser)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(streaming(handler.unary_stream), des, ser)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(unary(handler.stream_unary, False), des, ser)
    if handler.stream_stream is not None:
        return grpc.stream_stream_rpc_method_handler(streaming(handler.stream_stream), des, ser)
    return handler
