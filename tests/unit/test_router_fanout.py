"""Fan-out: per-broker outcomes, one retry only after a lost connection, the overall deadline holds."""
from __future__ import annotations

import asyncio

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


class Blocking:
    """FanOut.run from the test thread, on a loop of its own."""

    def __init__(self) -> None:
        self.fanout = FanOut()

    def run(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return asyncio.run(self.fanout.run(*args, **kwargs))


@pytest.fixture
def fanout() -> Blocking:
    return Blocking()


def test_every_broker_gets_an_outcome_in_key_order(fanout: Blocking) -> None:
    async def two(_t: float) -> int:
        return 2

    async def fail(_t: float) -> int:
        raise FakeRpcError(grpc.StatusCode.INTERNAL, "boom")

    out = fanout.run({"b": two, "a": fail}, timeout_s=1, per_call_s=0.5)
    assert [o.key for o in out] == ["b", "a"]
    assert out[0].ok and out[0].value == 2 and out[0].attempts == 1
    assert not out[1].ok and out[1].error_code == "INTERNAL" and out[1].error_message == "boom" and out[1].attempts == 1


def test_a_connection_lost_mid_call_is_retried_once(fanout: Blocking) -> None:
    calls = []

    async def flaky(_t: float) -> str:
        calls.append(1)
        if len(calls) < 2:
            raise FakeRpcError(grpc.StatusCode.UNAVAILABLE, "Socket closed")
        return "ok"

    out = fanout.run({"a": flaky}, timeout_s=2, per_call_s=0.5)[0]
    assert out.ok and out.value == "ok" and out.attempts == 2


@pytest.mark.parametrize("details", [
    "commitlog of broker-b did not answer: UNAVAILABLE: failed to connect",  # the broker's own answer
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.9:1: Failed to connect to remote host: connect: Connection refused (111)",
])
def test_a_dead_broker_costs_one_attempt_and_its_cause_is_passed_through(fanout: Blocking, details: str) -> None:
    calls = []

    async def dead(_t: float) -> str:
        calls.append(1)
        raise FakeRpcError(grpc.StatusCode.UNAVAILABLE, details)

    out = fanout.run({"a": dead}, timeout_s=2, per_call_s=0.5)[0]
    assert len(calls) == 1 and out.attempts == 1
    assert out.error_code == "UNAVAILABLE" and out.error_message == details


def test_invalid_argument_is_not_retried(fanout: Blocking) -> None:
    calls = []

    async def bad(_t: float) -> str:
        calls.append(1)
        raise FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT, "topic: bad")

    out = fanout.run({"a": bad}, timeout_s=2, per_call_s=0.5)[0]
    assert out.error_code == "INVALID_ARGUMENT" and len(calls) == 1


def test_a_hanging_broker_costs_at_most_the_deadline(fanout: Blocking) -> None:
    finished = []

    async def fast(_t: float) -> str:
        return "x"

    async def hang(_t: float) -> str:
        await asyncio.Event().wait()  # never set: only the fan-out's deadline ends it
        finished.append(1)
        return "late"

    out = fanout.run({"fast": fast, "slow": hang}, timeout_s=0.3, per_call_s=0.3)
    assert not finished  # the answer came without waiting for the hanging call
    assert out[0].ok
    assert out[1].error_code == "DEADLINE_EXCEEDED"
    # one broker alone is held to the same deadline
    [alone] = fanout.run({"slow": hang}, timeout_s=0.3, per_call_s=0.3)
    assert alone.error_code == "DEADLINE_EXCEEDED" and not finished


def test_transport_failures_are_told_from_a_services_own_unavailable() -> None:
    from quarry.transport import lost_connection, transport_failure

    refused = FakeRpcError(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Connection refused")
    own = FakeRpcError(grpc.StatusCode.UNAVAILABLE, "commitlog of broker-b did not answer: UNAVAILABLE: failed to connect to all addresses")
    lost = FakeRpcError(grpc.StatusCode.UNAVAILABLE, "Socket closed")
    assert transport_failure(refused) and not lost_connection(refused)
    assert not transport_failure(own) and not lost_connection(own)
    assert transport_failure(lost) and lost_connection(lost)
    assert not transport_failure(FakeRpcError(grpc.StatusCode.INTERNAL, "Socket closed"))


def test_an_ipv6_peer_is_read_as_grpc_escapes_it() -> None:
    from quarry.channels import parse_peer

    assert parse_peer("ipv6:%5B::1%5D:45678") == ("::1", 45678)  # what grpcio reports for [::1]
    assert parse_peer("ipv6:%5Bfe80::1%25eth0%5D:7") == ("fe80::1", 7)
    assert parse_peer("ipv4:127.0.0.1:5") == ("127.0.0.1", 5)


def test_a_cancelled_query_cancels_its_broker_calls() -> None:
    async def go() -> list[str]:
        ended: list[str] = []
        started = asyncio.Event()

        def hanging(name: str):  # type: ignore[no-untyped-def]
            async def call(timeout: float) -> None:
                started.set()
                try:
                    await asyncio.sleep(timeout)
                    ended.append(f"{name} ran to its deadline")
                except asyncio.CancelledError:
                    ended.append(f"{name} cancelled")
                    raise
            return call

        query = asyncio.ensure_future(FanOut().run({"a": hanging("a"), "b": hanging("b")}, timeout_s=30, per_call_s=30))
        await asyncio.wait_for(started.wait(), 10)
        query.cancel()
        with pytest.raises(asyncio.CancelledError):
            await query
        async with asyncio.timeout(10):
            while len(ended) < 2:
                await asyncio.sleep(0.01)
        return sorted(ended)

    assert asyncio.run(go()) == ["a cancelled", "b cancelled"]
