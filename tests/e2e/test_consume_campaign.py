"""SIGKILL of the commitlog during consumption with the Python SDK's SimpleConsumer (fast case of
`python -m scripts.consume_campaign --kills 20`, docs/reliability.md): every sent message acked,
none delivered again after a confirmed ack, unconfirmed ones redelivered or shown CONSUMED."""
from __future__ import annotations

from pathlib import Path

from scripts.consume_campaign import run


def test_acked_never_redelivered_unacked_redelivered_nothing_skipped(tmp_path: Path) -> None:
    report = run(tmp_path, kills=4, messages=200, seed=3, drain_s=120)
    assert report.kills == 4 and report.sent == 200
    assert report.lost == [] and report.delivered_after_ack == []
    assert report.ok
