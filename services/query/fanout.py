"""Call many brokers at once, each with its own deadline inside the overall one.

Like a sharded cache's fan-out: every shard (broker) gets a per-call timeout, and the
caller gets every shard's outcome — answered or failed and why — so a slow broker costs at
most its deadline and never fails the whole query. A dead broker costs one connection
attempt: a refused connection or a broker's own UNAVAILABLE answer is reported at once with
its cause; only a connection lost mid-call is tried once more (a new connection may work).
"""
from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

import grpc
from tenacity import Retrying, retry_if_exception, stop_after_attempt, stop_after_delay, wait_exponential_jitter

from quarry.transport import lost_connection

T = TypeVar("T")
K = TypeVar("K")

MAX_ATTEMPTS = 2  # the first, and one more after a connection lost mid-call


@dataclass
class Outcome(Generic[T]):
    """One broker's answer or failure."""

    key: str
    value: T | None = None
    error_code: str = ""
    error_message: str = ""
    latency_ms: int = 0
    attempts: int = 0

    @property
    def ok(self) -> bool:
        return not self.error_code


def _retryable(exc: BaseException) -> bool:
    return lost_connection(exc)


def call_with_retry(call: Callable[[float], T], deadline: float, per_call_s: float, on_attempt: Callable[[], None] = lambda: None) -> T:
    """Run call(timeout), once more after a connection lost mid-call, while time is left.

    Each attempt's timeout is min(per_call_s, time left); on_attempt counts attempts.
    """

    def _once() -> T:
        on_attempt()
        left = deadline - time.monotonic()
        if left <= 0.001:
            raise TimeoutError("overall deadline exceeded")
        return call(min(per_call_s, left))

    budget = max(0.0, deadline - time.monotonic())
    retrying = Retrying(
        retry=retry_if_exception(_retryable),
        stop=stop_after_delay(budget) | stop_after_attempt(MAX_ATTEMPTS),
        wait=wait_exponential_jitter(initial=0.02, max=0.25, jitter=0.02),
        reraise=True,
    )
    return retrying(_once)


class FanOut:
    """A shared worker pool that runs one call per broker and gathers outcomes by the deadline."""

    def __init__(self, max_workers: int = 32) -> None:
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="fanout")

    def run(self, calls: dict[str, Callable[[float], T]], timeout_s: float, per_call_s: float) -> list[Outcome[T]]:
        """Call every `calls[key](timeout)` concurrently; return one Outcome per key, in key order.

        Returns by the overall deadline even if a call hangs: the late call is reported as
        DEADLINE_EXCEEDED and its eventual answer is dropped.
        """
        deadline = time.monotonic() + timeout_s
        started = time.monotonic()
        futures = {}
        for key, call in calls.items():
            futures[self._pool.submit(self._one, key, call, deadline, per_call_s)] = key
        outcomes: dict[str, Outcome[T]] = {}
        pending = set(futures)
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            done, pending = wait(pending, timeout=left + 0.05, return_when=FIRST_COMPLETED)
            for fut in done:
                outcomes[futures[fut]] = fut.result()
        for fut in pending:
            key = futures[fut]
            fut.cancel()
            outcomes[key] = Outcome(key=key, error_code="DEADLINE_EXCEEDED", error_message=f"no answer within {timeout_s * 1000:.0f} ms", latency_ms=int((time.monotonic() - started) * 1000))
        return [outcomes[k] for k in calls]

    @staticmethod
    def _one(key: str, call: Callable[[float], T], deadline: float, per_call_s: float) -> Outcome[T]:
        t0 = time.monotonic()
        out: Outcome[T] = Outcome(key=key)

        def _count() -> None:
            out.attempts += 1

        try:
            out.value = call_with_retry(call, deadline, per_call_s, _count)
        except grpc.RpcError as exc:
            out.error_code = exc.code().name  # type: ignore[attr-defined]
            out.error_message = exc.details() or ""  # type: ignore[attr-defined]
        except TimeoutError as exc:
            out.error_code, out.error_message = "DEADLINE_EXCEEDED", str(exc)
        except Exception as exc:  # a broker's bad answer must not fail the whole query
            out.error_code, out.error_message = "INTERNAL", f"{type(exc).__name__}: {exc}"
        out.latency_ms = int((time.monotonic() - t0) * 1000)
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
