"""Health from state, the probe's exit codes, and each service's own metrics (issue 15
items 16 and 17), through the processes' flags, gRPC health, the probe command and /metrics."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, router_pb2, router_pb2_grpc
from scripts.launcher import MODULES, free_port
from tests.e2e.conftest import Launch, wait_until

HOST = "127.0.0.61"


def _probe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "quarry.services.probe", *args], capture_output=True, text=True, timeout=60)


def _status(address: str) -> int:
    with grpc.insecure_channel(address) as ch:
        return int(health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5).status)


def _scrape(port: int, host: str = HOST) -> dict[str, float]:
    """Every sample of /metrics as 'name{label="v",...}' -> value (labels sorted)."""
    text = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def _names(samples: dict[str, float]) -> set[str]:
    return {k.split("{", 1)[0] for k in samples}


SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


def test_probe_exit_codes_and_pauses_between_retries(launch: Launch) -> None:
    metrics_port = free_port(HOST)
    router = launch("router", "--metrics-port", str(metrics_port), host=HOST)
    ok = _probe("--addr", router.address)
    assert (ok.returncode, ok.stdout.strip()) == (0, "status: SERVING")

    nobody = _probe("--addr", f"{HOST}:{free_port(HOST)}", "--timeout", "1")
    assert nobody.returncode == 2 and "failed to connect" in nobody.stderr

    unknown = _probe("--addr", router.address, "--service", "no.such.Service", "--timeout", "2", "--retry-interval", "0.5")
    assert unknown.returncode == 3 and "NOT_FOUND" in unknown.stderr
    # It waited between attempts: a busy loop makes hundreds of calls in 2 s.
    checks = _scrape(metrics_port)['quarry_rpc_requests_total{code="NOT_FOUND",method="Check",service="grpc.health.v1.Health"}']
    assert 1 <= checks <= 8, checks

    bad = _probe("--addr", router.address, "--timeout", "-1")
    assert bad.returncode == 1
    assert all(len(r.stderr.strip().splitlines()) == 1 for r in (nobody, unknown))


def test_indexer_health_follows_its_tail_connection(launch: Launch, tmp_path: Path) -> None:
    cl_port = free_port(HOST)
    cl_args = ["--store-dir", str(tmp_path / "store"), "--segment-size", str(1 << 20)]
    cl = launch("commitlog", *cl_args, host=HOST, port=cl_port)
    ix_metrics = free_port(HOST)
    ix = launch("indexer", "--index-dir", str(tmp_path / "index"), "--commitlog", cl.address, "--hash-slots", "11", "--index-num", "40",
                "--metrics-port", str(ix_metrics), host=HOST)
    assert _status(ix.address) == SERVING
    assert _scrape(ix_metrics)["quarry_indexer_tail_connected"] == 1.0
    cl.stop()
    wait_until(lambda: _status(ix.address) == NOT_SERVING, what="indexer NOT_SERVING without its commitlog")
    assert _scrape(ix_metrics)["quarry_indexer_tail_connected"] == 0.0
    unhealthy = _probe("--addr", ix.address, "--timeout", "1")
    assert unhealthy.returncode == 4 and "NOT_SERVING" in unhealthy.stderr
    assert "no Tail connection" in ix.log_path.read_text()  # the reason is logged with the change
    launch("commitlog", *cl_args, host=HOST, port=cl_port)
    wait_until(lambda: _status(ix.address) == SERVING, what="indexer SERVING again once tailing")


def test_each_service_exports_only_its_own_metrics_in_base_units(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    ports = {name: free_port("127.0.0.1") for name in ("router", "commitlog", "indexer")}
    cluster = cluster_factory(commitlog_args=["--metrics-port", str(ports["commitlog"])], indexer_args=["--metrics-port", str(ports["indexer"])])
    cluster.start_router("--metrics-port", str(ports["router"]))
    broker = cluster.add_broker("broker-a", "127.0.0.62")
    with grpc.insecure_channel(broker.commitlog.address) as ch:
        stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
        for i in range(3):
            stub.SendMessage(commitlog_pb2.SendMessageRequest(message=common_pb2.MessageInput(topic="MetricsTopic", body=b"x", keys=[f"k{i}"], queue_id=-1)), timeout=5)
        with pytest.raises(grpc.RpcError):
            stub.SendMessage(commitlog_pb2.SendMessageRequest(message=common_pb2.MessageInput(topic="bad topic!", body=b"x")), timeout=5)
    cluster.wait_indexed()
    assert cluster.router is not None
    with grpc.insecure_channel(cluster.router.address) as ch:
        router_pb2_grpc.QueryRouterServiceStub(ch).QueryMsgByKey(router_pb2.QueryMsgByKeyRequest(topic="MetricsTopic", key="k1"), timeout=10)

    # A call is counted when gRPC reports it terminated, which may be just after the client has
    # its answer: wait for the counts instead of reading them once.
    svc = 'service="quarry.v1.CommitLogService"'
    router_key = 'quarry_rpc_requests_total{code="OK",method="QueryMsgByKey",service="quarry.v1.QueryRouterService"}'
    commitlog_key = f'quarry_rpc_duration_seconds_count{{code="OK",method="SendMessage",{svc}}}'
    wait_until(lambda: _scrape(ports["router"], "127.0.0.1").get(router_key) == 1, what="router counted QueryMsgByKey")
    wait_until(lambda: _scrape(ports["commitlog"], "127.0.0.62").get(commitlog_key) == 3, what="commitlog counted 3 sends")
    router = _scrape(ports["router"], "127.0.0.1")
    commitlog = _scrape(ports["commitlog"], "127.0.0.62")
    indexer = _scrape(ports["indexer"], "127.0.0.62")
    own = {"router": _names(router), "commitlog": _names(commitlog), "indexer": _names(indexer)}
    for name, names in own.items():
        others = {"quarry_router_", "quarry_commitlog_", "quarry_indexer_"} - {f"quarry_{name}_"}
        assert not {n for n in names if n.startswith(tuple(others))}, f"{name} exports another service's metrics"
        assert not {n for n in names if n.endswith(("_ms", "_millis", "_milliseconds"))}, f"{name}: not in base units"
    assert commitlog[f'quarry_rpc_requests_total{{code="OK",method="SendMessage",{svc}}}'] == 3
    assert commitlog[f'quarry_rpc_requests_total{{code="INVALID_ARGUMENT",method="SendMessage",{svc}}}'] == 1
    assert commitlog[f'quarry_rpc_duration_seconds_count{{code="OK",method="SendMessage",{svc}}}'] == 3
    assert router['quarry_rpc_requests_total{code="OK",method="QueryMsgByKey",service="quarry.v1.QueryRouterService"}'] == 1
    assert indexer['quarry_rpc_requests_total{code="OK",method="QueryMessage",service="quarry.v1.IndexerService"}'] >= 1
    assert router['quarry_router_brokers{state="live"}'] == 1 and router['quarry_router_brokers{state="missing"}'] == 0
    assert indexer["quarry_indexer_tail_connected"] == 1
    assert "quarry_indexer_lag_seconds" in indexer
    # A broker that stops heartbeating is counted missing, not dropped.
    broker.indexer.stop()
    broker.commitlog.stop()
    wait_until(lambda: _scrape(ports["router"], "127.0.0.1")['quarry_router_brokers{state="missing"}'] == 1, what="broker-a counted missing")
    assert _scrape(ports["router"], "127.0.0.1")['quarry_router_brokers{state="live"}'] == 0


@pytest.mark.parametrize("kind", ["router", "commitlog", "indexer"])
def test_a_taken_metrics_port_is_one_line_and_exit_2(kind: str, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = {"router": [], "commitlog": ["--store-dir", str(tmp_path / "s")], "indexer": ["--index-dir", str(tmp_path / "i"), "--commitlog", "127.0.0.1:1"]}[kind]
        proc = subprocess.run([sys.executable, "-m", MODULES[kind], "--bind", f"127.0.0.1:{free_port()}", "--metrics-port", str(port), *args],
                              cwd=tmp_path, env={**os.environ}, capture_output=True, text=True, timeout=60)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "refusing to start" in lines[0] and f"--metrics-port [env QUARRY_METRICS_PORT]: cannot listen on 127.0.0.1:{port}" in lines[0]
    assert not (tmp_path / "s").exists()  # the commitlog stopped before opening its store
