"""Operator-facing behaviour of the service processes: settings from the environment are
refused exactly like flags, and every log event stays on one line whatever a peer sends."""
from __future__ import annotations

import os
import subprocess
import sys
import time
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


# Issue 32, defect 4: where the RocketMQ 4 remoting port listens by default, what a broker
# announces, and a port that cannot be bound. Hosts 127.0.0.141-149 are these tests' own.

@pytest.fixture
def bare(tmp_path: Path):  # type: ignore[no-untyped-def]
    """bare(host, *args) starts a commitlog on host with exactly these flags (the launcher would
    add a --remoting-bind) and waits until SERVING; stopped after the test."""
    from quarry.services.probe import wait_healthy
    from scripts.launcher import free_port

    started: list[tuple[subprocess.Popen[bytes], Path]] = []
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUARRY_")}

    def _start(host: str, *args: str) -> tuple[str, Path]:
        address, log = f"{host}:{free_port(host)}", tmp_path / f"commitlog-{len(started)}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", MODULES["commitlog"], "--bind", address, "--store-dir", str(tmp_path / f"s{len(started)}"), *args],
                                    cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        started.append((proc, log))
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                wait_healthy(address, deadline_s=0.5)
                return address, log
            except TimeoutError:
                assert time.monotonic() < deadline, log.read_text()

    yield _start
    for proc, _ in started:
        proc.terminate()
    for proc, _ in started:
        proc.wait(15)


def _announced(log: Path) -> dict[str, str]:
    [line] = [line for line in _lines(log) if 'event="broker announces"' in line]
    return dict(item.split("=", 1) for item in line.split() if "=" in item)


def test_without_remoting_flags_a_commitlog_listens_and_writes_ids_on_its_bind_host(bare) -> None:  # type: ignore[no-untyped-def]
    import socket

    from quarry.formats import offset_msg_id
    from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2

    address, log = bare("127.0.0.141")
    with socket.create_connection(("127.0.0.141", 10931), timeout=5):  # the remoting port, on the --bind host
        pass
    with grpc.insecure_channel(address) as ch:
        sent = commitlog_pb2_grpc.CommitLogServiceStub(ch).SendMessage(
            commitlog_pb2.SendMessageRequest(message=common_pb2.MessageInput(topic="HostTopic", body=b"x", queue_id=-1)), timeout=10)
    decoded = offset_msg_id.decode(sent.result.offset_msg_id)
    assert (decoded.ip, decoded.port) == ("127.0.0.141", 10931), decoded  # the id names the address 4.x clients dial
    said = _announced(log)
    assert (said["grpc"], said["remoting"], said["store_host"], said["rmq5"]) == (address, "127.0.0.141:10931", "127.0.0.141:10931", address)


def test_two_commitlogs_without_remoting_flags_start_and_a_taken_remoting_port_is_one_line(bare, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from scripts.launcher import free_port

    _, first = bare("127.0.0.142")
    _, second = bare("127.0.0.143")
    assert (_announced(first)["remoting"], _announced(second)["remoting"]) == ("127.0.0.142:10931", "127.0.0.143:10931")
    # A second broker on 127.0.0.143 (another gRPC port, no remoting flags): its remoting port is taken.
    proc = subprocess.run([sys.executable, "-m", MODULES["commitlog"], "--bind", f"127.0.0.143:{free_port('127.0.0.143')}", "--store-dir", str(tmp_path / "third")],
                          cwd=tmp_path, env={k: v for k, v in os.environ.items() if not k.startswith("QUARRY_")}, capture_output=True, text=True, timeout=60)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1 and "refusing to start" in lines[0], lines
    assert "--remoting-bind [env QUARRY_COMMITLOG_REMOTING_BIND]: cannot listen on 127.0.0.143:10931: Address already in use" in lines[0]


@pytest.mark.parametrize(("kind", "flag", "env"), [
    ("commitlog", "--bind", "QUARRY_COMMITLOG_BIND"),
    ("indexer", "--bind", "QUARRY_INDEXER_BIND"),
    ("router", "--bind", "QUARRY_ROUTER_BIND"),
    ("router", "--remoting-bind", "QUARRY_ROUTER_REMOTING_BIND"),
])
def test_a_port_that_cannot_be_bound_stops_any_service_in_one_line(kind: str, flag: str, env: str, tmp_path: Path) -> None:
    import socket

    from scripts.launcher import free_port

    with socket.socket() as taken:
        taken.bind(("127.0.0.144", 0))
        taken.listen()
        port = taken.getsockname()[1]
        bind = f"127.0.0.144:{port}" if flag == "--bind" else f"127.0.0.144:{free_port('127.0.0.144')}"
        args = {"--bind": [], "--remoting-bind": ["--remoting-bind", f"127.0.0.144:{port}"]}[flag]
        own = {"router": ["--remoting-bind", f"127.0.0.144:{free_port('127.0.0.144')}"], "commitlog": ["--store-dir", str(tmp_path / "s"), "--remoting-bind", "off"],
               "indexer": ["--index-dir", str(tmp_path / "i"), "--commitlog", "127.0.0.1:1"]}[kind]
        proc = subprocess.run([sys.executable, "-m", MODULES[kind], "--bind", bind, *own, *args], cwd=tmp_path,
                              env={k: v for k, v in os.environ.items() if not k.startswith("QUARRY_")}, capture_output=True, text=True, timeout=60)
    # (gRPC's own C core may print its failed bind too, outside the service's log)
    refusals = [line for line in proc.stderr.splitlines() if "refusing to start" in line]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert len(refusals) == 1 and f"{flag} [env {env}]: cannot listen on 127.0.0.144:{port}" in refusals[0], proc.stderr


def test_the_router_refuses_a_second_broker_announcing_the_same_store_host(launch: Launch, tmp_path: Path) -> None:
    router = launch("router", "--heartbeat-interval-ms", "200")
    common = ["--router", router.address, "--heartbeat-interval-ms", "200", "--store-host", "127.0.0.145:10931"]
    first = launch("commitlog", "--broker-name", "broker-a", "--store-dir", str(tmp_path / "a"), *common, host="127.0.0.145")
    with grpc.insecure_channel(router.address) as ch:
        stub = router_pb2_grpc.QueryRouterServiceStub(ch)
        wait_until(lambda: [b.broker_name for b in stub.ListBrokers(router_pb2.ListBrokersRequest(), timeout=5).brokers] == ["broker-a"], what="broker-a registered")
        second = launch("commitlog", "--broker-name", "broker-b", "--store-dir", str(tmp_path / "b"), *common, host="127.0.0.146")
        wait_until(lambda: "router refused the registration" in second.log_path.read_text(), what="broker-b told it is refused")
        [refused] = [line for line in _lines(second.log_path) if "router refused the registration" in line]
        assert "ALREADY_EXISTS" in refused and "127.0.0.145:10931" in refused and "'broker-a'" in refused and "'broker-b'" in refused, refused
        assert [b.broker_name for b in stub.ListBrokers(router_pb2.ListBrokersRequest(), timeout=5).brokers] == ["broker-a"]
        assert sum('event="broker registration refused"' in line for line in _lines(router.log_path)) == 1  # once, not every heartbeat
        # broker-a stops; once it misses its heartbeats its store host is free for broker-b.
        first.stop()
        wait_until(lambda: "registered with router" in second.log_path.read_text(), what="broker-b registered once broker-a went missing")
        live = {b.broker_name: b.missing for b in stub.ListBrokers(router_pb2.ListBrokersRequest(), timeout=5).brokers}
        assert live == {"broker-a": True, "broker-b": False}
    assert sum("router refused the registration" in line for line in _lines(second.log_path)) == 1  # logged when it changed only
