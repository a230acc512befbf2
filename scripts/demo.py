"""Quarry's main job on its embedded default: a router and two brokers (commitlog + indexer
each, on 127.0.0.1 and 127.0.0.2) on loopback; messages sent with the producer and with the
official RocketMQ 5 Python SDK, then found again with the `quarry` CLI by offsetMsgId, by key
and by unique key.

In a terminal the cluster then keeps serving until Ctrl-C, so `.venv/bin/quarry <command>` (and
the README's SDK examples) work from another terminal; QUARRY_DEMO_HOLD=1 does the same without
a terminal. Otherwise (CI, a pipe) or with --once it stops at once and says so."""
from __future__ import annotations

import io
import json
import os
import signal
import socket
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from quarry.clients.cli import main as quarry
from quarry.clients.producer import Producer
from scripts.console_process import ConsoleProcess
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


def _send_with_rocketmq5_sdk(router: str) -> str:
    """One message sent as a RocketMQ 5 user would: the official SDK, the router as endpoint."""
    from rocketmq import ClientConfiguration, Credentials, Message, Producer as Rmq5Producer

    producer = Rmq5Producer(ClientConfiguration(router, Credentials()), (TOPIC,))
    producer.startup()
    try:
        m = Message()
        m.topic, m.body, m.tag = TOPIC, b"order 1003 paid (RocketMQ 5 SDK)", "paid"
        m.keys = "order-1003"
        receipt = producer.send(m)
    finally:
        producer.shutdown()
    print(f"RocketMQ 5 SDK receipt: message_id={receipt.message_id} offset={receipt.offset}")
    return str(receipt.message_id)


def _wait_for_unique_key(router: str, uid: str, timeout_s: float = 20.0) -> str:
    end = time.monotonic() + timeout_s
    pause = threading.Event()
    while time.monotonic() < end:
        out = io.StringIO()  # quiet while the indexer catches up
        code, text = quarry(["-n", router, "queryMsgByUniqueKey", "-t", TOPIC, "-i", uid], out=out, err=io.StringIO()), out.getvalue()
        if code == 0 and uid in text:
            return text
        pause.wait(0.05)
    raise TimeoutError(f"unique key {uid} not indexed within {timeout_s}s")


def _serve_until_stopped(router: str) -> None:
    print(f"\nThe cluster keeps serving until Ctrl-C (router, also the RocketMQ 5 SDKs' access point: {router}).\n"
          f"In another terminal, from this directory:\n"
          f"  export NAMESRV_ADDR={router}\n"
          f"  .venv/bin/quarry clusterList\n"
          f"  .venv/bin/quarry queryMsgByKey -t {TOPIC} -k customer-42\n", flush=True)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    signal.sigwait({signal.SIGINT, signal.SIGTERM})
    print("\nstopping the cluster", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    serve = "--once" not in args and (bool(os.environ.get("QUARRY_DEMO_HOLD")) or (sys.stdin.isatty() and sys.stdout.isatty()))
    with tempfile.TemporaryDirectory(prefix="quarry-demo-") as tmp:
        cluster = LocalCluster(root=Path(tmp), commitlog_args=["--segment-size", str(64 << 20)], indexer_args=["--hash-slots", "100003", "--index-num", "400000"])
        console: ConsoleProcess | None = None
        try:
            router = cluster.start_router().address
            for name, host in (("broker-a", "127.0.0.1"), ("broker-b", "127.0.0.2")):
                b = cluster.add_broker(name, host)
                print(f"{name}: commitlog {b.commitlog.address}, indexer {b.indexer.address}")
            print(f"router: {router}")
            console = _start_console(router, Path(tmp))
            print(f"console: {console.url}/  (quarry-console: search, browse, message pages in a browser)\n")
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
            print(f"$ quarry queryMsgByUniqueKey -t {TOPIC} -i <id the RocketMQ 5 SDK returned>")
            sdk_id = _send_with_rocketmq5_sdk(router)
            text = _wait_for_unique_key(router, sdk_id)
            print(text)
            if not ok:
                print("FAILED: a message was not found as sent", file=sys.stderr)
                return 1
            print(f"$ curl '{console.url}/api/search?q={first.offset_msg_id}'  (what the console's search box asks)")
            found = _console_search(console.url, first.offset_msg_id)
            print(found + "\n")
            if first.offset_msg_id not in found:
                print("FAILED: the console did not find the message", file=sys.stderr)
                return 1
            print("OK: every message was found by id, key and unique key, and by the console")
            if serve:
                print(f"Quarry Console: {console.url}/search?q={first.offset_msg_id}")
                _serve_until_stopped(router)
            else:
                print("Not a terminal (or --once): the cluster stops now. Run `make run` in a terminal to keep it serving.")
        finally:
            if console is not None:
                console.stop()
            cluster.stop()
    return 0


def _start_console(router: str, root: Path) -> ConsoleProcess:
    """quarry-console beside the cluster: on port 8080 when it is free (QUARRY_CONSOLE_PORT
    chooses another), else on any free port; its address is printed."""
    wanted = int(os.environ.get("QUARRY_CONSOLE_PORT", "8080"))
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", wanted))
    except OSError:
        wanted = 0
    return ConsoleProcess(router, root / "logs" / "console.log", port=wanted).start()


def _console_search(url: str, query: str) -> str:
    with urllib.request.urlopen(f"{url}/api/search?q={query}", timeout=20) as r:
        answer = json.load(r)
    return f"took it as {answer['kind']}: {answer['reading']}; found {[m['offsetMsgId'] for m in answer['messages']]}"


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C before the demo finished: the cluster was stopped
        sys.exit(130)
