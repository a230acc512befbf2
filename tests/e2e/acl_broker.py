"""One broker (commitlog + indexer) with QUARRY_ACL_FILE holding the given accounts, every
process checking calls against them and signing its own calls as the first (admin) account:
what the access-control tests of the RocketMQ 4 door start."""
from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from scripts.launcher import ServiceProcess, free_port


@contextmanager
def acl_broker(root: Path, host: str, accounts: list[dict[str, Any]]) -> Iterator[str]:
    """Start the broker under `root` on `host`; yields its remoting address, stops it after."""
    (root / "acl.json").write_text(json.dumps({"accounts": accounts}))
    admin = accounts[0]
    assert admin.get("admin"), "the first account signs Quarry's own calls: make it an admin"
    env = {"QUARRY_ACL_FILE": str(root / "acl.json"), "QUARRY_ACCESS_KEY": admin["access_key"], "QUARRY_SECRET_KEY": admin["secret_key"]}
    cl_addr, ix_addr = f"{host}:{free_port(host)}", f"{host}:{free_port(host)}"
    procs = [
        ServiceProcess("commitlog", cl_addr, ["--store-dir", str(root / "store"), "--indexer-addr", ix_addr, "--flush-interval-ms", "20"],
                       root / "commitlog.log", env=env),
        ServiceProcess("indexer", ix_addr, ["--index-dir", str(root / "index"), "--commitlog", cl_addr, "--flush-interval-ms", "20"],
                       root / "indexer.log", env=env),
    ]
    try:
        for p in procs:
            p.start()
        yield procs[0].remoting_address
    finally:
        for p in reversed(procs):
            p.stop()
