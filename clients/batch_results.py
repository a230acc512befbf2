"""A SendBatch answer as one SendResult per message, whichever form the broker answered in:
`results` as sent, or the compact columns (SendResultColumns, asked for with
compact_results) rebuilt with the batch's own messages, exactly as the broker would have
written each SendResult."""
from __future__ import annotations

import itertools
from typing import Sequence

from quarry.clients.errors import QuarryError
from quarry.formats.offset_msg_id import create as offset_msg_id
from quarry.v1 import commitlog_pb2, common_pb2


def batch_send_results(response: commitlog_pb2.SendBatchResponse, messages: Sequence[common_pb2.MessageInput]) -> list[common_pb2.SendResult]:
    """One SendResult per message of the request, in its order. A broker that predates
    compact_results answers with `results`, which are taken as they are."""
    if not response.HasField("compact"):
        return list(response.results)
    return rebuild_send_results(response.compact, messages)


def rebuild_send_results(columns: commitlog_pb2.SendResultColumns, messages: Sequence[common_pb2.MessageInput]) -> list[common_pb2.SendResult]:
    """The contract's rule (commitlog.proto, SendResultColumns): message i's SendResult from
    column i, the batch-wide fields and message i's own unique key. QuarryError (INTERNAL)
    when the columns do not hold one entry per message."""
    n = len(messages)
    lengths = {"physical_offsets": len(columns.physical_offsets), "queue_ids": len(columns.queue_ids), "queue_offsets": len(columns.queue_offsets)}
    if columns.topics:
        lengths["topics"] = len(columns.topics)
    wrong = [f"{name} has {count}" for name, count in lengths.items() if count != n]
    if wrong:
        raise QuarryError("INTERNAL", f"compact send results: {', '.join(wrong)} entries for a batch of {n} messages")
    host = columns.store_host
    ip, port = host.ip, host.port
    status, broker = columns.status, columns.broker_name
    topics = columns.topics or itertools.repeat(columns.topic, n)
    return [
        common_pb2.SendResult(status=status, unique_key=m.unique_key, offset_msg_id=offset_msg_id(ip, port, at), queue_id=qid,
                              queue_offset=qoff, physical_offset=at, topic=topic, broker_name=broker)
        for m, at, qid, qoff, topic in zip(messages, columns.physical_offsets, columns.queue_ids, columns.queue_offsets, topics)
    ]
