"""Quarry's main job on its embedded default: a router and one broker (commitlog + indexer)
on loopback, one message sent, then found again by offsetMsgId, by key and by unique key."""
from __future__ import annotations

import os
import socket
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import grpc

from formats.unique_key import UniqueKeyGenerator
from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, router_pb2, router_pb2_grpc
from services.launcher import LocalCluster

TOPIC = "DemoTopic"


def _wait(predicate, timeout_s: float, what: str):  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout_s
    pause = threading.Event()
    while time.monotonic() < end:
        try:
            value = predicate()
            if value:
                return value
        except grpc.RpcError:
            pass
        pause.wait(0.05)
    raise TimeoutError(f"timed out waiting for {what}")


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="quarry-demo-") as tmp:
        cluster = LocalCluster(root=Path(tmp), commitlog_args=["--segment-size", str(64 << 20)], indexer_args=["--hash-slots", "100003", "--index-num", "400000"])
        try:
            router = cluster.start_router()
            broker = cluster.add_broker("broker-a", "127.0.0.1")
            print(f"router     {router.address}  SERVING")
            print(f"commitlog  {broker.commitlog.address}  SERVING  (store {broker.store_dir})")
            print(f"indexer    {broker.indexer.address}  SERVING  (index {broker.index_dir})")
            ip = socket.gethostbyname("localhost")
            uid = UniqueKeyGenerator(ip, os.getpid(), id(UniqueKeyGenerator) & 0x7FFFFFFF, datetime.now().astimezone().tzinfo).next_id()
            with grpc.insecure_channel(broker.commitlog.address) as cl, grpc.insecure_channel(router.address) as rc:
                commitlog = commitlog_pb2_grpc.CommitLogServiceStub(cl)
                query = router_pb2_grpc.QueryRouterServiceStub(rc)
                msg = common_pb2.MessageInput(topic=TOPIC, body=b"order 1001 paid", keys=["order-1001"], tags="paid", unique_key=uid, queue_id=-1)
                sent = commitlog.SendMessage(commitlog_pb2.SendMessageRequest(message=msg), timeout=5).result
                print(f"\nsent       msgId={sent.unique_key} offsetMsgId={sent.offset_msg_id} queue={sent.queue_id} queueOffset={sent.queue_offset}")
                by_id = query.QueryMsgById(router_pb2.QueryMsgByIdRequest(offset_msg_id=sent.offset_msg_id), timeout=5).result
                print(f"by id      {by_id.messages[0].offset_msg_id} body={by_id.messages[0].body.decode()!r}")
                by_key = _wait(lambda: query.QueryMsgByKey(router_pb2.QueryMsgByKeyRequest(topic=TOPIC, key="order-1001"), timeout=5).result.messages, 20, "the key to be indexed")
                print(f"by key     order-1001 -> {[m.offset_msg_id for m in by_key]}")
                by_uniq = query.QueryMsgByUniqueKey(router_pb2.QueryMsgByUniqueKeyRequest(topic=TOPIC, unique_key=uid), timeout=5).result
                print(f"by uniqkey {uid} -> {[m.offset_msg_id for m in by_uniq.messages]} (copies={by_uniq.copies})")
                found = {by_id.messages[0].offset_msg_id, by_key[0].offset_msg_id, by_uniq.messages[0].offset_msg_id}
                if found != {sent.offset_msg_id}:
                    print(f"MISMATCH: sent {sent.offset_msg_id}, found {found}", file=sys.stderr)
                    return 1
            print("\nOK: the message was found by id, key and unique key")
        finally:
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
