"""Faults on real processes: the commitlog loses its router, the disk fills up."""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, router_pb2, router_pb2_grpc
from scripts.launcher import free_port
from tests.e2e.conftest import Launch, wait_until
from tests.filesystems import small_tmpfs


def _send(stub: commitlog_pb2_grpc.CommitLogServiceStub, i: int, size: int = 64) -> common_pb2.SendResult:
    msg = common_pb2.MessageInput(topic="FaultTopic", body=bytes([i % 256]) * size, keys=[f"f{i}"], unique_key=f"FU{i:08d}", queue_id=-1)
    return stub.SendMessage(commitlog_pb2.SendMessageRequest(message=msg), timeout=5).result


def _brokers(router_addr: str) -> list[str]:
    with grpc.insecure_channel(router_addr) as ch:
        return [b.broker_name for b in router_pb2_grpc.QueryRouterServiceStub(ch).ListBrokers(router_pb2.ListBrokersRequest(), timeout=2).brokers]


def test_commitlog_keeps_taking_writes_without_its_router_and_registers_again(launch: Launch, tmp_path: Path) -> None:
    port = free_port()
    router = launch("router", "--heartbeat-interval-ms", "200", port=port)
    cl = launch("commitlog", "--store-dir", str(tmp_path / "s"), "--router", router.address, "--heartbeat-interval-ms", "200", "--broker-name", "broker-p", host="127.0.0.41")
    wait_until(lambda: _brokers(router.address) == ["broker-p"], what="registered")
    router.kill()
    with grpc.insecure_channel(cl.address) as ch:
        stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
        sent = [_send(stub, i) for i in range(20)]  # the router is gone: writes go on
        assert all(r.status == common_pb2.SEND_STATUS_SEND_OK for r in sent)
        again = launch("router", "--heartbeat-interval-ms", "200", port=port)
        wait_until(lambda: _brokers(again.address) == ["broker-p"], what="re-registered with the new router")
        got = stub.GetMessages(commitlog_pb2.GetMessagesRequest(physical_offsets=[r.physical_offset for r in sent]), timeout=5)
        assert len(got.messages) == 20
    # The router records a registration before it answers; the commitlog logs it after.
    wait_until(lambda: "router unreachable" in (t := cl.log_tail(200)) and t.count("registered with router") >= 2, what="both registrations logged")


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path, "1m") as mnt:
        yield mnt


def test_disk_full_is_resource_exhausted_loses_nothing_and_recovers(launch: Launch, small_fs: Path) -> None:
    cl = launch("commitlog", "--store-dir", str(small_fs / "store"), "--segment-size", str(256 * 1024), "--cq-units-per-file", "1000", host="127.0.0.42")
    acked: list[common_pb2.SendResult] = []
    with grpc.insecure_channel(cl.address) as ch:
        stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
        err = None
        for i in range(2000):
            try:
                acked.append(_send(stub, i, size=2048))
            except grpc.RpcError as exc:
                err = exc
                break
        assert err is not None and err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
        assert "no space" in err.details()
        assert len(acked) > 50
        # Still full: still refused, still serving reads of everything acknowledged.
        with pytest.raises(grpc.RpcError) as again:
            _send(stub, 99_999, size=2048)
        assert again.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # Health from state: a commitlog that cannot store says so to probes and orchestrators.
        health = health_pb2_grpc.HealthStub(ch)
        status = lambda: health.Check(health_pb2.HealthCheckRequest(), timeout=5).status  # noqa: E731
        wait_until(lambda: status() == health_pb2.HealthCheckResponse.NOT_SERVING, what="NOT_SERVING with the disk full")
        assert "disk full" in cl.log_path.read_text()
        got = stub.GetMessages(commitlog_pb2.GetMessagesRequest(physical_offsets=[r.physical_offset for r in acked[-500:]]), timeout=10)
        assert not got.not_found and [m.unique_key for m in got.messages] == [r.unique_key for r in acked[-500:]]
        # Space returns: writes resume, nothing acknowledged before is lost.
        subprocess.run(["mount", "-o", "remount,size=8m", str(small_fs)], check=True)
        later = [_send(stub, 5000 + i, size=2048) for i in range(20)]
        assert all(r.status == common_pb2.SEND_STATUS_SEND_OK for r in later)
        wait_until(lambda: status() == health_pb2.HealthCheckResponse.SERVING, what="SERVING again once writes succeed")
        offsets = [r.physical_offset for r in acked + later]
        for chunk in range(0, len(offsets), 500):
            got = stub.GetMessages(commitlog_pb2.GetMessagesRequest(physical_offsets=offsets[chunk:chunk + 500]), timeout=10)
            assert not got.not_found
