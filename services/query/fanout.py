"""Call many brokers at once, each with its own deadline inside the overall one.

Like a sharded cache's fan-out: every shard (broker) gets a per-call timeout, and the
caller gets every shard's outcome — answered or failed and why — so a slow broker costs at
most its deadline and never fails the whole query. A dead broker costs one connection
attempt: a refused connection or a broker's own UNAVAILABLE answer is reported at once with
its cause; only a connection lost mid-call is tried once more (a new connection may work).

The calls are coroutines on the router's event loop (grpc.aio), gathered by asyncio: no
thread per call.
"""
from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Generic, TypeVar, cast

import grpc

from quarry.transport import lost_connection

T = TypeVar("T")

MAX_ATTEMPTS = 2  # the first, and one more after a connection lost mid-call
RETRY_PAUSE_S = (0.02, 0.25)  # first pause, longest pause (doubling, plus up to 20 ms of jitter)

BrokerCall = Callable[[float], Awaitable[T]]  # call(timeout_s) -> the broker's answer


@dataclass
class Outcome(Generic[T]):
    """One broker's answer or failure."""

    key: str
    value: T | None = None
    error_code: str = ""
    error_message: str = ""
    latency_ms: int = 0
    attempts: int = 0
    ruled_out: bool = False  # not asked: its key presence filter rules the key out (answered: nothing)
    ruled_out_at: int = -1  # then: the index position the filter's copy was whole up to

    @property
    def ok(self) -> bool:
        return not self.error_code

    def answer(self) -> T:
        """The value of an ok outcome (only a failed one holds None)."""
        return cast(T, self.value)


class BrokerError(Exception):
    """A broker's failure told by the router's own call code (not a status the broker sent):
    reported in the broker's outcome with this code and message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


async def call_with_retry(call: BrokerCall[T], deadline: float, per_call_s: float, on_attempt: Callable[[], None] = lambda: None) -> T:
    """Await call(timeout), once more after a connection lost mid-call, while time is left.

    Each attempt's timeout is min(per_call_s, time left); on_attempt counts attempts.
    """
    attempt = 0
    while True:
        attempt += 1
        on_attempt()
        left = deadline - time.monotonic()
        if left <= 0.001:
            raise TimeoutError("overall deadline exceeded")
        try:
            return await call(min(per_call_s, left))
        except Exception as exc:
            if attempt >= MAX_ATTEMPTS or not lost_connection(exc):
                raise
            pause = min(RETRY_PAUSE_S[1], RETRY_PAUSE_S[0] * 2 ** (attempt - 1)) + random.uniform(0, 0.02)
            if time.monotonic() + pause >= deadline:
                raise
            await asyncio.sleep(pause)


class FanOut:
    """Runs one call per broker on the event loop and gathers outcomes by the deadline."""

    async def run(self, calls: dict[str, BrokerCall[T]], timeout_s: float, per_call_s: float) -> list[Outcome[T]]:
        """Await every `calls[key](timeout)` concurrently; return one Outcome per key, in key order.

        Returns by the overall deadline even if a call hangs: the late call is cancelled and
        reported as DEADLINE_EXCEEDED.
        """
        started = time.monotonic()
        deadline = started + timeout_s
        if len(calls) == 1:
            # One broker (by id, by offset, a single-broker query): no task, no gather.
            [(key, call)] = calls.items()
            try:
                async with asyncio.timeout(timeout_s + 0.05):
                    return [await self._one(key, call, deadline, per_call_s)]
            except TimeoutError:
                return [self._late(key, timeout_s, started)]
        tasks = {key: asyncio.ensure_future(self._one(key, call, deadline, per_call_s)) for key, call in calls.items()}
        if tasks:
            try:
                await asyncio.wait(tasks.values(), timeout=timeout_s + 0.05)
            except asyncio.CancelledError:
                # The query was cancelled (its client gave up): so are its broker calls, which
                # would otherwise run on to their own deadlines.
                for task in tasks.values():
                    task.cancel()
                raise
        outcomes = []
        for key, task in tasks.items():
            if task.done():
                outcomes.append(task.result())
            else:
                task.cancel()
                outcomes.append(self._late(key, timeout_s, started))
        return outcomes

    @staticmethod
    def _late(key: str, timeout_s: float, started: float) -> Outcome[T]:
        return Outcome(key=key, error_code="DEADLINE_EXCEEDED", error_message=f"no answer within {timeout_s * 1000:.0f} ms",
                       latency_ms=int((time.monotonic() - started) * 1000))

    @staticmethod
    async def _one(key: str, call: BrokerCall[T], deadline: float, per_call_s: float) -> Outcome[T]:
        t0 = time.monotonic()
        out: Outcome[T] = Outcome(key=key)

        def _count() -> None:
            out.attempts += 1

        try:
            out.value = await call_with_retry(call, deadline, per_call_s, _count)
        except grpc.RpcError as exc:
            out.error_code = exc.code().name  # type: ignore[attr-defined]
            out.error_message = exc.details() or ""  # type: ignore[attr-defined]
        except BrokerError as exc:
            out.error_code, out.error_message = exc.code, exc.message
        except TimeoutError as exc:
            out.error_code, out.error_message = "DEADLINE_EXCEEDED", str(exc)
        except Exception as exc:  # a broker's bad answer must not fail the whole query
            out.error_code, out.error_message = "INTERNAL", f"{type(exc).__name__}: {exc}"
        out.latency_ms = int((time.monotonic() - t0) * 1000)
        return out
