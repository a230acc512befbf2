"""The fast load case: 16 clients mixing sends and all four queries; no unexpected errors,
bounded memory. The long run is `python -m scripts.load_campaign --seconds 60`."""
from __future__ import annotations

from pathlib import Path

from scripts.load_campaign import run


def test_sixteen_clients_mixing_sends_and_queries(tmp_path: Path) -> None:
    # Generous time limits: the case looks for errors, not for how slow a loaded CI machine is
    # (a broker call past the default 1 s, or 1.5 s without a heartbeat, would count as one).
    report = run(tmp_path, clients=16, seconds=6,
                 router_args=("--broker-call-timeout-ms", "10000", "--query-timeout-ms", "20000", "--missed-heartbeats", "20"))
    assert report["unexpected_errors"] == {}
    assert set(report["operations"]) == {"send", "id", "key", "unique", "offset"}
    assert all(op["count"] > 10 for op in report["operations"].values())
    assert all(mb < 1024 for mb in report["peak_rss_mb"].values()), report["peak_rss_mb"]
