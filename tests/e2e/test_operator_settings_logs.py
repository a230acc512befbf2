"""Operator-facing behaviour of the service processes: settings from the environment are
refused exactly like flags, and every log event stays on one line whatever a peer sends."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from scripts.launcher import MODULES
from quarry.v1 import router_pb2, router_pb2_grpc
from tests.e2e.conftest import Launch, wait_until


@pytest.mark.parametrize(("kind", "env", "value", "message"), [
    ("commitlog", "QUARRY_FLUSH_MODE", "sometimes", "--flush-mode [env QUARRY_FLUSH_MODE]: must be one of ASYNC, SYNC, got 'sometimes'"),
    ("indexer", "QUARRY_INDEX_HASH_SLOTS", "many", "--hash-slots [env QUARRY_INDEX_HASH_SLOTS]: must be an integer, got 'many'"),
    ("router", "QUARRY_LOG_FORMAT", "xml", "--log-format [env QUARRY_LOG_FORMAT]: must be one of kv, json, got 'xml'"),
])
def test_a_bad_environment_value_stops_the_service_at_start(kind: str, env: str, value: str, message: str, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", MODULES[kind], "--bind", "127.0.0.1:0"], cwd=tmp_path,
        env={**os.environ, env: value}, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and f"(from environment variable {env})" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "var").exists()  # nothing was created before the refusal


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text(errors="replace").splitlines() if line.strip()]


@pytest.mark.parametrize("fmt", ["kv", "json"])
def test_a_newline_sent_by_a_peer_cannot_forge_a_log_line(fmt: str, launch: Launch) -> None:
    """A broker name is logged as the peer sent it; its newline is escaped, so every line of the
    log is one event starting with its timestamp (kv) or one JSON object (json)."""
    router = launch("router", "--log-format", fmt)
    forged = "evil\nforged-line\u2028and-more"  # no space, quote or '=': only the newline needs escaping
    with grpc.insecure_channel(router.address) as ch:
        stub = router_pb2_grpc.QueryRouterServiceStub(ch)
        stub.RegisterBroker(router_pb2.RegisterBrokerRequest(broker_name=forged, commitlog_addr="127.0.0.1:1", store_host="127.0.0.1:1"), timeout=5)
    wait_until(lambda: "broker registered" in router.log_path.read_text(), what="the registration logged")
    lines = _lines(router.log_path)
    if fmt == "kv":
        assert all(line.startswith("ts=") for line in lines), lines
        assert any('broker="evil\\nforged-line\\u2028and-more"' in line for line in lines)
    else:
        import json

        events = [json.loads(line) for line in lines]
        assert any(e.get("broker") == forged for e in events)


def test_topic_created_names_each_topic_once(launch: Launch, tmp_path: Path) -> None:
    from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2

    cl = launch("commitlog", "--store-dir", str(tmp_path / "store"), "--segment-size", str(1 << 20))
    with grpc.insecure_channel(cl.address) as ch:
        stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
        batch = [common_pb2.MessageInput(topic="FreshTopic", body=b"x", queue_id=-1) for _ in range(5)]
        stub.SendBatch(commitlog_pb2.SendBatchRequest(messages=batch), timeout=10)
        stub.SendBatch(commitlog_pb2.SendBatchRequest(messages=batch), timeout=10)
        stub.SendMessage(commitlog_pb2.SendMessageRequest(message=common_pb2.MessageInput(topic="OtherTopic", body=b"y", queue_id=-1)), timeout=10)
    created = [line for line in _lines(cl.log_path) if 'event="topic created"' in line]
    assert len(created) == 2, created
    assert "topic=FreshTopic " in created[0] and "topic=OtherTopic " in created[1]


@pytest.mark.parametrize(("env", "message"), [
    ({"QUARRY_ACL_FILE": "/nonexistent/acl.json"}, "QUARRY_ACL_FILE=/nonexistent/acl.json: cannot read it"),
    ({"QUARRY_TLS_CERT": "/nonexistent/server.pem"}, "QUARRY_TLS_CERT and QUARRY_TLS_KEY: set both"),
    ({"QUARRY_TLS_CERT": "/nonexistent/server.pem", "QUARRY_TLS_KEY": "/nonexistent/key.pem"}, "cannot read it"),
])
@pytest.mark.parametrize("kind", ["router", "indexer", "commitlog"])
def test_security_variables_that_cannot_be_honoured_stop_the_service_in_one_line(kind: str, env: dict[str, str], message: str, tmp_path: Path) -> None:
    from scripts.launcher import free_port

    args = {"router": ["--remoting-bind", "off"], "commitlog": ["--store-dir", str(tmp_path / "s"), "--remoting-bind", "off"],
            "indexer": ["--index-dir", str(tmp_path / "i"), "--commitlog", "127.0.0.1:1"]}[kind]
    proc = subprocess.run([sys.executable, "-m", MODULES[kind], "--bind", f"127.0.0.1:{free_port()}", *args],
                          cwd=tmp_path, env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "refusing to start" in line]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("kind", ["commitlog", "router"])
def test_health_says_serving_only_once_the_remoting_port_listens(kind: str, launch: Launch, tmp_path: Path) -> None:
    import socket

    args = ["--store-dir", str(tmp_path / "store")] if kind == "commitlog" else []
    proc = launch(kind, *args)  # returns once health says SERVING
    host, port = proc.args[proc.args.index("--remoting-bind") + 1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5):  # one attempt: no retry may hide a late port
        pass
    lines = _lines(proc.log_path)
    remoting = next(i for i, line in enumerate(lines) if "remoting server started" in line)
    serving = next(i for i, line in enumerate(lines) if 'event="server started"' in line)  # logged once health says SERVING
    assert remoting < serving, lines
