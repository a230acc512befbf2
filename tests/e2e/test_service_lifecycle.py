"""Each service starts as a real process, reports SERVING, lists its services over reflection,
and exits cleanly on SIGTERM within a deadline."""
from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.e2e.conftest import Launch

SERVICES = {
    "commitlog": "quarry.v1.CommitLogService",
    "indexer": "quarry.v1.IndexerService",
    "router": "quarry.v1.QueryRouterService",
}


def _args(kind: str, tmp_path: Path) -> list[str]:
    if kind == "commitlog":
        return ["--store-dir", str(tmp_path / "store"), "--segment-size", str(1 << 20)]
    if kind == "indexer":
        return ["--index-dir", str(tmp_path / "index"), "--commitlog", "127.0.0.1:1", "--hash-slots", "101", "--index-num", "400"]
    return []


def _list_services(address: str) -> set[str]:
    with grpc.insecure_channel(address) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        responses = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)
        first = next(iter(responses))
        return {s.name for s in first.list_services_response.service}


@pytest.mark.parametrize("kind", sorted(SERVICES))
def test_service_serves_health_and_reflection_and_stops_on_sigterm(kind: str, launch: Launch, tmp_path: Path) -> None:
    proc = launch(kind, *_args(kind, tmp_path))
    with grpc.insecure_channel(proc.address) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        overall = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert overall.status == health_pb2.HealthCheckResponse.SERVING
        named = health.Check(health_pb2.HealthCheckRequest(service=SERVICES[kind]), timeout=5)
        assert named.status == health_pb2.HealthCheckResponse.SERVING
    services = _list_services(proc.address)
    assert SERVICES[kind] in services
    assert "grpc.health.v1.Health" in services

    assert proc.proc is not None
    proc.proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{kind} did not exit within 15 s of SIGTERM")
    assert rc == 0
    log = proc.log_tail(50)
    assert "server started" in log and "server stopped" in log
