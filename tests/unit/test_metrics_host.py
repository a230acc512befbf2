"""The metrics port listens on --metrics-host (loopback keeps topic names on the host), else on
the --bind host, for every service."""
from __future__ import annotations

import pytest

from quarry.services.settings import metrics_host


@pytest.mark.parametrize("service", ["commitlog", "indexer", "router"])
def test_the_metrics_host_defaults_to_the_bind_host_and_can_be_loopback(service: str) -> None:
    from quarry.services.commitlog.config import build_parser as commitlog
    from quarry.services.indexer.config import build_parser as indexer
    from quarry.services.query.config import build_parser as router

    parser = {"commitlog": commitlog, "indexer": indexer, "router": router}[service]()
    args = parser.parse_args(["--bind", "10.1.2.3:10911", "--metrics-port", "9100"])
    assert metrics_host(args) == "10.1.2.3"
    args = parser.parse_args(["--bind", "10.1.2.3:10911", "--metrics-port", "9100", "--metrics-host", "127.0.0.1"])
    assert metrics_host(args) == "127.0.0.1"
