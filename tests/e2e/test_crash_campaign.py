"""The fast crash-under-load campaign: 20 SIGKILLs per run (commitlog and indexer of one
broker, 10 each) while two producers send; both flush modes. The long campaign is
`python -m scripts.crash_campaign --kills 20 --flush-mode SYNC` (docs/reliability.md)."""
from __future__ import annotations

from pathlib import Path

import pytest

from scripts.crash_campaign import run


@pytest.mark.parametrize("flush_mode", ["ASYNC", "SYNC"])
def test_every_acknowledged_message_survives_twenty_kills(tmp_path: Path, flush_mode: str) -> None:
    report = run(tmp_path, kills=10, flush_mode=flush_mode, seed=7, rate=40)
    assert report.kills == {"commitlog": 10, "indexer": 10}
    assert report.acked > 100
    assert report.lost == []
    assert report.not_found_by_key == []
    assert report.not_found_by_unique_key == []
    assert report.duplicates_returned == 0
    assert report.queue_problems == []
