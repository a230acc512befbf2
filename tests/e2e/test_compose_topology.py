"""compose.yaml run as local processes: each service's command and environment as the real
Compose parser resolves them, host names mapped to distinct loopback addresses, ports as
declared, start order from depends_on, readiness from the file's own health probe.

A renamed variable or a wrong port in compose.yaml breaks this test."""
from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

from quarry.clients.admin import AdminClient
from quarry.clients.producer import Producer
from tests.contract.test_compose import compose_config
from tests.vectors import REPO_ROOT
from tests.e2e import mqadmin
from tests.e2e.conftest import wait_until
from tests.e2e.pki import make_pki


IPS = [f"127.0.1.{i + 10}" for i in range(7)]  # one loopback address per compose service


def _topology(overlays: tuple[Path, ...] = (), env: dict[str, str] | None = None) -> dict:
    result = compose_config(REPO_ROOT / "compose.yaml", *overlays, env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _start_order(services: dict) -> list[str]:
    order: list[str] = []
    while len(order) < len(services):
        ready = [n for n, s in services.items() if n not in order and all(d in order for d in (s.get("depends_on") or {}))]
        assert ready, f"depends_on cycle among {set(services) - set(order)}"
        order += sorted(ready)
    return order


class Topology:
    """The compose services as processes; `ips` maps service names to 127.0.0.x."""

    def __init__(self, root: Path, overlays: tuple[Path, ...] = (), env: dict[str, str] | None = None) -> None:
        self.cfg = _topology(overlays, env)
        self.services = self.cfg["services"]
        self.ips = {name: IPS[i] for i, name in enumerate(sorted(self.services))}
        self.root = root
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def rewrite(self, service: str, value: str) -> str:
        """Service host names → their loopback IPs; wildcard binds → the service's own IP;
        127.0.0.1 (a container's own loopback) → the service's IP; /data → its volume dir."""
        for name, ip in self.ips.items():
            value = re.sub(rf"(?<![\w.-]){re.escape(name)}(?=:\d)", ip, value)
        value = value.replace("0.0.0.0:", f"{self.ips[service]}:").replace("127.0.0.1:", f"{self.ips[service]}:")
        for vol in self.services[service].get("volumes", []):
            if value.startswith(vol["target"] + "/") or value == vol["target"]:
                value = str(self.root / vol["source"]) + value[len(vol["target"]):]
        return value

    def start(self, name: str) -> None:
        svc = self.services[name]
        env = {k: v for k, v in os.environ.items() if not k.startswith("QUARRY_")}
        env.update({k: self.rewrite(name, str(v)) for k, v in (svc.get("environment") or {}).items()})
        log = open(self.root / f"{name}.log", "ab")
        cmd = [sys.executable, "-m", "quarry.entrypoint", *svc["command"]]
        self.procs[name] = subprocess.Popen(cmd, env=env, cwd=self.root, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        probe = [self.rewrite(name, a) for a in svc["healthcheck"]["test"][1:]]
        assert probe[:4] == ["python", "-m", "quarry.entrypoint", "console-probe" if name == "console" else "probe"]
        probe[0] = sys.executable

        def healthy() -> bool:
            if self.procs[name].poll() is not None:
                pytest.fail(f"{name} exited: {(self.root / f'{name}.log').read_text()[-2000:]}")
            return subprocess.run(probe, cwd=self.root, capture_output=True, timeout=30).returncode == 0

        wait_until(healthy, timeout_s=60, what=f"{name} healthy by its compose probe")

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def address(self, name: str, port: int) -> str:
        return f"{self.ips[name]}:{port}"


@pytest.fixture(params=["plaintext", "tls"])
def topology(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Topology]:
    overlays: tuple[Path, ...] = ()
    env: dict[str, str] = {}
    if request.param == "tls":
        # Mutual TLS for every service and for this test's own clients (compose.tls.yaml).
        pki = make_pki(tmp_path / "pki", IPS)
        certs = tmp_path / "certs"
        certs.mkdir()
        for src, dst in (("ca", "ca.pem"), ("server_cert", "server.pem"), ("server_key", "server-key.pem"), ("client_cert", "client.pem"), ("client_key", "client-key.pem")):
            (certs / dst).write_bytes(Path(pki[src]).read_bytes())
        overlays, env = (REPO_ROOT / "compose.tls.yaml",), {"QUARRY_CERTS_DIR": str(certs)}
        monkeypatch.setenv("QUARRY_TLS_CA", str(certs / "ca.pem"))
        monkeypatch.setenv("QUARRY_TLS_CLIENT_CERT", str(certs / "client.pem"))
        monkeypatch.setenv("QUARRY_TLS_CLIENT_KEY", str(certs / "client-key.pem"))
    topo = Topology(tmp_path, overlays, env)
    try:
        for name in _start_order(topo.services):
            topo.start(name)
        yield topo
    finally:
        for name in list(topo.procs):
            topo.stop(name)


def test_compose_topology_sends_finds_and_reports_a_lost_broker(topology: Topology) -> None:
    published = topology.services["router"]["ports"][0]
    router = topology.address("router", int(published["target"]))
    with Producer(router) as producer, AdminClient(router) as admin:
        wait_until(lambda: len(admin.brokers()) == 2, what="both brokers registered")
        sent = [producer.send("ComposeTopic", f"m{i}".encode(), keys=["compose-key", f"k{i}"]) for i in range(6)]
        assert {s.message_queue.broker_name for s in sent} == {"broker-a", "broker-b"}
        for s in sent:
            assert admin.query_by_id(s.offset_msg_id).messages[0].unique_key == s.msg_id
        found = wait_until(lambda: (r := admin.query_by_key("ComposeTopic", "compose-key")) and len(r.messages) == 6 and r, what="all six by key")
        assert {m.offset_msg_id for m in found.messages} == {s.offset_msg_id for s in sent}
        for s in sent:
            assert admin.query_by_unique_key("ComposeTopic", s.msg_id).messages[0].offset_msg_id == s.offset_msg_id

        # RocketMQ 4's key query (mqadmin's requests) through the router's NameServer port: each
        # commitlog answers it from its indexer's IndexFiles, mapped from the indexer's volume.
        namesrv = topology.rewrite("router", topology.services["router"]["environment"]["QUARRY_ROUTER_REMOTING_BIND"])
        by_key = wait_until(lambda: (r := asyncio.run(mqadmin.query_message(namesrv, "ComposeTopic", "compose-key", 64, 0, mqadmin.LONG_MAX, False))[0])
                            and len(r) == 6 and r, what="all six by key over RocketMQ 4 remoting")
        assert {r.unique_key for r in by_key} == {s.msg_id for s in sent}
        for b in ("a", "b"):
            log = (topology.root / f"commitlog-{b}.log").read_text()
            assert "key queries read the indexer's files here" in log and "key queries ask the indexer" not in log, log[-2000:]

        port = int(topology.services["router"]["environment"]["QUARRY_METRICS_PORT"])
        for name in set(topology.services) - {"console"}:  # the console has no metrics port
            body = urllib.request.urlopen(f"http://{topology.ips[name]}:{port}/metrics", timeout=5).read().decode()
            assert "quarry_" in body, name
        assert "quarry_commitlog_sent_messages_total" in urllib.request.urlopen(f"http://{topology.ips['commitlog-a']}:{port}/metrics", timeout=5).read().decode()

        # The console (a client of both routers, TLS to them in the TLS overlay) finds a message.
        console = topology.address("console", int(topology.services["console"]["ports"][0]["target"]))
        url = f"http://{console}/api/search?q={sent[0].offset_msg_id}"
        answer = json.load(urllib.request.urlopen(url, timeout=30))
        assert answer["kind"] == "offsetMsgId" and [m["uniqueKey"] for m in answer["messages"]] == [sent[0].msg_id]

        # The second router knows both brokers too and answers the same query on its own.
        router_2 = topology.address("router-2", int(topology.services["router-2"]["ports"][0]["target"]))
        with AdminClient(router_2) as admin_2:
            wait_until(lambda: len(admin_2.brokers()) == 2, what="both brokers registered with router-2")
            again = wait_until(lambda: (r := admin_2.query_by_key("ComposeTopic", "compose-key")) and r.complete and len(r.messages) == 6 and r,
                               what="all six by key through router-2")
            assert {m.offset_msg_id for m in again.messages} == {s.offset_msg_id for s in sent}

        topology.stop("commitlog-b")  # SIGTERM, as `docker compose stop commitlog-b`
        partial = admin.query_by_key("ComposeTopic", "compose-key")
        assert not partial.complete
        assert [b.broker_name for b in partial.failed_brokers] == ["broker-b"]
        assert partial.messages and {m.broker_name for m in partial.messages} == {"broker-a"}
