"""Quarry's main job on its embedded default: start a router and one broker on loopback,
and report their health. (Sending and finding messages arrives with the services.)"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from services.launcher import ServiceProcess, free_port


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="quarry-demo-") as tmp:
        root = Path(tmp)
        procs: list[ServiceProcess] = []
        try:
            router = ServiceProcess("router", f"127.0.0.1:{free_port()}", [], root / "router.log").start()
            procs.append(router)
            commitlog_addr = f"127.0.0.1:{free_port()}"
            indexer_addr = f"127.0.0.1:{free_port()}"
            procs.append(ServiceProcess("commitlog", commitlog_addr, ["--store-dir", str(root / "store"), "--router", router.address, "--indexer-addr", indexer_addr], root / "commitlog.log").start())
            procs.append(ServiceProcess("indexer", indexer_addr, ["--index-dir", str(root / "index"), "--commitlog", commitlog_addr, "--router", router.address], root / "indexer.log").start())
            for p in procs:
                print(f"{p.kind:10s} {p.address:22s} SERVING")
        finally:
            for p in reversed(procs):
                p.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
