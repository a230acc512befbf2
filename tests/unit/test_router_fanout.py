"""Fan-out: per-broker outcomes, retries of UNAVAILABLE only, the overall deadline holds."""
from __future__ import annotations

import threading
import time

import grpc
import pytest

from quarry.services.query.fanout import FanOut


class FakeRpcError(grpc.RpcError):
    """An RpcError with a status, as a real channel raises it."""

    def __init__(self, code: grpc.StatusCode, details: str = "") -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


@pytest.fixture
def fanout() -> FanOut:
    f = FanOut()
    yield f
    f.close()


def test_every_broker_gets_an_outcome_in_key_order(fanout: FanOut) -> None:
    def fail(_t: float) -> int:
        raise FakeRpcError(grpc.StatusCode.INTERNAL, "boom")

    out = fanout.run({"b": lambda t: 2, "a": fail}, timeout_s=1, per_call_s=0.5)
    assert [o.key for o in out] == ["b", "a"]
    assert out[0].ok and out[0].value == 2 and out[0].attempts == 1
    assert not out[1].ok and out[1].error_code == "INTERNAL" and out[1].error_message == "boom" and out[1].attempts == 1


def test_unavailable_is_retried_while_time_is_left(fanout: FanOut) -> None:
    calls = []

    def flaky(_t: float) -> str:
        calls.append(1)
        if len(calls) < 3:
            raise FakeRpcError(grpc.StatusCode.UNAVAILABLE, "down")
        return "ok"

    out = fanout.run({"a": flaky}, timeout_s=2, per_call_s=0.5)[0]
    assert out.ok and out.value == "ok" and out.attempts == 3


def test_invalid_argument_is_not_retried(fanout: FanOut) -> None:
    calls = []

    def bad(_t: float) -> str:
        calls.append(1)
        raise FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT, "topic: bad")

    out = fanout.run({"a": bad}, timeout_s=2, per_call_s=0.5)[0]
    assert out.error_code == "INVALID_ARGUMENT" and len(calls) == 1


def test_a_hanging_broker_costs_at_most_the_deadline(fanout: FanOut) -> None:
    release = threading.Event()
    finished = threading.Event()

    def hang(_t: float) -> str:
        release.wait(60)
        finished.set()
        return "late"

    out = fanout.run({"fast": lambda t: "x", "slow": hang}, timeout_s=0.3, per_call_s=0.3)
    # The answer came while the slow call was still hanging: nobody waited for it.
    answered_before_the_hang_ended = not finished.is_set()
    release.set()
    assert answered_before_the_hang_ended
    assert out[0].ok
    assert out[1].error_code == "DEADLINE_EXCEEDED"
