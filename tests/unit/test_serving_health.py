"""Health follows state even when the state changes between the start-up check and the monitor."""
from __future__ import annotations

import asyncio
import threading

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from quarry.services.serving import start_aio_server

SERVING = health_pb2.HealthCheckResponse.SERVING


class FirstCallUnhealthy:
    """NOT_SERVING on the start-up evaluation only: the state became healthy right after it."""

    def __init__(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self) -> str:
        with self.lock:
            self.calls += 1
            return "connecting" if self.calls == 1 else ""


def _status(address: str) -> int:
    with grpc.insecure_channel(address) as ch:
        return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5).status


def _wait_serving(address: str, check: FirstCallUnhealthy) -> None:
    # Bounded by evaluations, not by time: the monitor must publish SERVING within a few rounds.
    pause = threading.Event()
    while check.calls < 20:
        if _status(address) == SERVING:
            return
        pause.wait(0.05)
    raise AssertionError(f"still NOT_SERVING after {check.calls} health evaluations")


def test_asyncio_server_publishes_a_state_that_healed_before_its_monitor_started() -> None:
    check = FirstCallUnhealthy()

    async def main() -> None:
        running = await start_aio_server("health-test", "127.0.0.1:0", [], health_check=check)
        try:
            await asyncio.get_running_loop().run_in_executor(None, _wait_serving, running.address, check)
        finally:
            if running._monitor is not None:
                running._monitor.cancel()
            await running.server.stop(None)

    asyncio.run(main())
