"""The indexer never overwrites a file Quarry did not create (issue 15 item 15).

Its state file is `quarry-index-checkpoint.json`; Quarry's old `checkpoint` (the name of
RocketMQ's store-root checkpoint) is migrated, and a RocketMQ checkpoint is never touched:
pointed at a RocketMQ store root the indexer refuses to start, unless read-only.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import grpc

from scripts.launcher import MODULES, free_port
from quarry.v1 import indexer_pb2, indexer_pb2_grpc
from tests.e2e.conftest import Launch


def _rocketmq_store_root(root: Path) -> Path:
    """A directory shaped like a RocketMQ broker's store root: its 4 KiB binary checkpoint
    (physicMsgTimestamp, logicsMsgTimestamp, indexMsgTimestamp, big-endian) and commitlog/."""
    root.mkdir(parents=True)
    page = bytearray(4096)
    struct.pack_into(">qqq", page, 0, 1_700_000_000_123, 1_700_000_000_100, 1_700_000_000_050)
    (root / "checkpoint").write_bytes(bytes(page))
    (root / "commitlog").mkdir()
    return root


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir" for p in sorted(root.rglob("*"))}


def _status(address: str) -> indexer_pb2.GetIndexStatusResponse:
    with grpc.insecure_channel(address) as ch:
        return indexer_pb2_grpc.IndexerServiceStub(ch).GetIndexStatus(indexer_pb2.GetIndexStatusRequest(), timeout=5)


def test_pointed_at_a_rocketmq_store_root_the_indexer_refuses_and_touches_nothing(tmp_path: Path) -> None:
    root = _rocketmq_store_root(tmp_path / "rmq-store")
    before = _digest(root)
    proc = subprocess.run(
        [sys.executable, "-m", MODULES["indexer"], "--bind", f"127.0.0.1:{free_port()}", "--index-dir", str(root), "--commitlog", "127.0.0.1:1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "refusing to start" in lines[0] and "not a Quarry checkpoint" in lines[0], lines
    assert "--read-only true" in lines[0]
    assert _digest(root) == before  # not one byte changed, nothing created


def test_read_only_serves_a_rocketmq_store_root_without_writing(tmp_path: Path, launch: Launch) -> None:
    root = _rocketmq_store_root(tmp_path / "rmq-store")
    (root / "index").mkdir()
    before = _digest(root)
    ix = launch("indexer", "--index-dir", str(root), "--commitlog", "127.0.0.1:1", "--read-only", "true")
    assert _status(ix.address).read_only
    assert ix.stop() == 0
    assert _digest(root) == before


def test_an_old_quarry_checkpoint_is_migrated_and_tailing_resumes_from_it(tmp_path: Path, launch: Launch) -> None:
    index_dir = tmp_path / "index-dir"
    index_dir.mkdir()
    (index_dir / "checkpoint").write_text(json.dumps({"next_offset": 4321, "timestamp": 1_700_000_000_000}))
    ix = launch("indexer", "--index-dir", str(index_dir), "--commitlog", "127.0.0.1:1", "--hash-slots", "11", "--index-num", "40", serving_only=False)
    assert _status(ix.address).checkpoint_offset == 4321  # resumed where the old file said
    assert not (index_dir / "checkpoint").exists()
    assert json.loads((index_dir / "quarry-index-checkpoint.json").read_text())["next_offset"] == 4321
    assert "checkpoint migrated" in ix.log_path.read_text()
    assert ix.stop() == 0
    assert not (index_dir / "checkpoint").exists()  # the indexer never writes the old name again
    assert os.stat(index_dir / "quarry-index-checkpoint.json").st_size > 0
