"""One writer per store (services/commitlog/storage/store_lock.py), through the commitlog process: a
second commitlog started on a store another one writes refuses to start with one line that
says why, the first goes on serving, and once the first has stopped the store opens again."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc

from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2
from scripts.launcher import MODULES, free_port
from tests.e2e.conftest import Launch


def _send(address: str, key: str) -> common_pb2.SendResult:
    with grpc.insecure_channel(address) as ch:
        msg = common_pb2.MessageInput(topic="OneWriter", body=b"x", keys=[key])
        return commitlog_pb2_grpc.CommitLogServiceStub(ch).SendMessage(commitlog_pb2.SendMessageRequest(message=msg), timeout=10).result


def test_a_second_commitlog_on_a_written_store_refuses_to_start(launch: Launch, tmp_path: Path) -> None:
    store = tmp_path / "store"
    first = launch("commitlog", "--store-dir", str(store), "--segment-size", str(1 << 20))
    sent = _send(first.address, "before")
    second = subprocess.run([sys.executable, "-m", MODULES["commitlog"], "--bind", f"127.0.0.1:{free_port()}", "--store-dir", str(store),
                             "--segment-size", str(1 << 20)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    lines = [line for line in second.stderr.splitlines() if line.strip()]
    assert second.returncode == 2 and len(lines) == 1, second.stderr
    assert "refusing to start" in lines[0] and "--store-dir [env QUARRY_STORE_DIR]" in lines[0] and "another writer" in lines[0]
    assert _send(first.address, "after").physical_offset > sent.physical_offset  # the first one goes on
    assert first.stop() == 0
    again = launch("commitlog", "--store-dir", str(store), "--segment-size", str(1 << 20))  # free again once it stopped
    assert _send(again.address, "again").physical_offset > sent.physical_offset
