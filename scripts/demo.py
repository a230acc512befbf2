"""Quarry's main job on its embedded default: a router and two brokers (commitlog + indexer
each, on 127.0.0.1 and 127.0.0.2) on loopback; messages sent with the producer, then found
again with the `quarry` CLI by offsetMsgId, by key and by unique key."""
from __future__ import annotations

import io
import sys
import tempfile
import threading
import time
from pathlib import Path

from quarry.clients.cli import main as quarry
from quarry.clients.producer import Producer
from scripts.launcher import LocalCluster

TOPIC = "DemoTopic"


def _cli(router: str, *args: str) -> tuple[int, str]:
    out = io.StringIO()
    code = quarry(["-n", router, *args], out=out, err=sys.stderr)
    return code, out.getvalue()


def _wait_for_key(router: str, key: str, count: int, timeout_s: float = 20.0) -> str:
    """Poll the key query until `count` messages are indexed (the indexer tails the log)."""
    end = time.monotonic() + timeout_s
    pause = threading.Event()
    while time.monotonic() < end:
        code, text = _cli(router, "queryMsgByKey", "-t", TOPIC, "-k", key)
        if code == 0 and len(text.strip().splitlines()) - 1 >= count:
            return text
        pause.wait(0.05)
    raise TimeoutError(f"key {key} not indexed within {timeout_s}s")


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="quarry-demo-") as tmp:
        cluster = LocalCluster(root=Path(tmp), commitlog_args=["--segment-size", str(64 << 20)], indexer_args=["--hash-slots", "100003", "--index-num", "400000"])
        try:
            router = cluster.start_router().address
            for name, host in (("broker-a", "127.0.0.1"), ("broker-b", "127.0.0.2")):
                b = cluster.add_broker(name, host)
                print(f"{name}: commitlog {b.commitlog.address}, indexer {b.indexer.address}")
            print(f"router: {router}   (NAMESRV_ADDR={router} quarry <command> … works while this runs)\n")
            with Producer(router) as producer:
                first = producer.send(TOPIC, b"order 1001 paid", keys=["order-1001", "customer-42"], tags="paid")
                second = producer.send(TOPIC, b"order 1002 paid", keys=["order-1002", "customer-42"], tags="paid")
            print(first)
            print(second)
            print("\n$ quarry queryMsgById -i", first.offset_msg_id)
            code, text = _cli(router, "queryMsgById", "-i", first.offset_msg_id)
            print(text)
            ok = code == 0 and first.offset_msg_id in text
            print("$ quarry queryMsgByKey -t", TOPIC, "-k customer-42")
            text = _wait_for_key(router, "customer-42", 2)
            print(text)
            ok = ok and first.msg_id in text and second.msg_id in text
            print(f"$ quarry queryMsgByUniqueKey -t {TOPIC} -i {second.msg_id}")
            code, text = _cli(router, "queryMsgByUniqueKey", "-t", TOPIC, "-i", second.msg_id)
            print(text)
            ok = ok and code == 0 and second.offset_msg_id in text
            if not ok:
                print("FAILED: a message was not found as sent", file=sys.stderr)
                return 1
            print("OK: every message was found by id, key and unique key")
        finally:
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
