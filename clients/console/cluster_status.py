"""The cluster page's per-broker status: its store (CommitLog segments and disk use, offsets,
damaged records, problems, what retention deleted), its index (lag, problems), and its queues
and consumer groups (offset ranges, each group's offset and lag).

Each broker is asked at the addresses it registered with the routers (as `quarry brokerStatus`
does): GetStoreStatus and GetConsumerProgress on its commitlog, GetIndexStatus on its indexer.
A broker that does not answer one of them gets that part's error, named; the others still show.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from quarry.clients.errors import QuarryError
from quarry.formats.topic import DLQ_PREFIX
from quarry.v1 import commitlog_pb2

BROKER_THREADS = 8


def _ask(call: Callable[[], Any]) -> tuple[Any, dict[str, str] | None]:
    try:
        return call(), None
    except QuarryError as exc:
        return None, {"code": exc.code, "message": exc.message}


def store_json(s: commitlog_pb2.GetStoreStatusResponse) -> dict[str, Any]:
    written = sum(g.written_bytes for g in s.segments)
    allocated = sum(g.size for g in s.segments)
    return {
        "minOffset": s.min_offset, "maxOffset": s.max_offset, "committedOffset": s.committed_offset, "segments": len(s.segments),
        "writtenBytes": written, "allocatedBytes": allocated, "flushMode": commitlog_pb2.FlushMode.Name(s.flush_mode).removeprefix("FLUSH_MODE_"),
        "readOnly": s.read_only, "recovered": s.recovered, "damaged": list(s.corruption), "problems": list(s.problems),
        # retention deletes whole segments from the log's start: everything below min_offset is gone
        "expired": {"fromPhysicalOffset": 0, "toPhysicalOffset": s.min_offset} if s.min_offset > 0 else None,
    }


def index_json(i: Any) -> dict[str, Any]:
    return {"files": len(i.files), "entries": i.total_entries, "checkpointOffset": i.checkpoint_offset, "lagBytes": i.lag_bytes, "lagMs": i.lag_ms,
            "tailConnected": i.tail_connected, "problems": list(i.problems), "readOnly": i.read_only,
            "lastIndexedStoreMs": i.index_last_update_timestamp}


def progress_json(p: commitlog_pb2.GetConsumerProgressResponse) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    queues = [{"topic": q.topic, "queueId": q.queue_id, "minOffset": q.min_queue_offset, "maxOffset": q.max_queue_offset} for q in p.queues]
    groups = [{"group": g.group, "topic": g.topic, "queueId": g.queue_id, "consumerOffset": g.consumer_offset, "maxOffset": g.max_queue_offset,
               "lag": g.lag, "source": g.source} for g in p.groups]
    return queues, groups


def broker_status(admin: Any, b: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"brokerName": b.broker_name, "missing": b.missing}
    if b.missing:
        out["error"] = {"code": "MISSING", "message": "stopped heartbeating to the routers: not asked"}
        return out
    store, out["storeError"] = _ask(lambda: admin.broker_status(b.commitlog_addr))
    out["store"] = store_json(store) if store is not None else None
    index, out["indexError"] = _ask(lambda: admin.index_status(b.indexer_addr)) if b.indexer_addr else (None, {"code": "NONE", "message": "no indexer registered"})
    out["index"] = index_json(index) if index is not None else None
    progress, out["progressError"] = _ask(lambda: admin.consumer_progress(b.commitlog_addr))
    out["queues"], out["groups"] = progress_json(progress) if progress is not None else ([], [])
    return out


def cluster_status(admin: Any) -> dict[str, Any]:
    """Every registered broker's status, and the consumer groups summed over brokers: lag per
    group and topic, and each group's dead letters (its %DLQ% topic's messages still held)."""
    brokers = admin.brokers()
    with ThreadPoolExecutor(BROKER_THREADS) as pool:
        statuses = list(pool.map(lambda b: broker_status(admin, b), brokers))
    groups: dict[tuple[str, str, str], dict[str, Any]] = {}
    dead: dict[str, int] = {}
    for s in statuses:
        for g in s.get("groups", []):
            row = groups.setdefault((g["group"], g["topic"], g["source"]), {"group": g["group"], "topic": g["topic"], "source": g["source"],
                                                                             "lag": 0, "queues": 0, "brokers": []})
            row["lag"] += g["lag"]
            row["queues"] += 1
            if s["brokerName"] not in row["brokers"]:
                row["brokers"].append(s["brokerName"])
        for q in s.get("queues", []):
            if q["topic"].startswith(DLQ_PREFIX):
                dead[q["topic"]] = dead.get(q["topic"], 0) + q["maxOffset"] - q["minOffset"]
    unanswered = [{"broker": s["brokerName"], "part": part, **s[key]} for s in statuses
                  for part, key in (("broker", "error"), ("store", "storeError"), ("index", "indexError"), ("queues", "progressError")) if s.get(key)]
    return {"brokers": statuses, "groups": sorted(groups.values(), key=lambda r: (r["group"], r["topic"], r["source"])),
            "deadLetters": [{"topic": t, "group": t[len(DLQ_PREFIX):], "messages": n} for t, n in sorted(dead.items())],
            "complete": not unanswered, "unanswered": unanswered}


def segment_of(admin: Any, broker_name: str, commit_log_offset: int) -> dict[str, Any]:
    """The CommitLog segment file holding a record, from its broker's store status:
    {"segment": {...}} or {"segmentError": {...}} saying why it is not known."""
    b = next((b for b in admin.brokers() if b.broker_name == broker_name), None)
    if b is None or b.missing:
        return {"segmentError": {"code": "MISSING" if b is not None else "NOT_FOUND", "message": f"broker {broker_name} is not live at the routers"}}
    status, error = _ask(lambda: admin.broker_status(b.commitlog_addr))
    if status is None:
        return {"segmentError": error}
    for s in status.segments:
        if s.start_offset <= commit_log_offset < s.start_offset + s.size:
            return {"segment": {"fileName": s.file_name, "startOffset": s.start_offset, "position": commit_log_offset - s.start_offset, "size": s.size}}
    return {"segmentError": {"code": "NOT_FOUND", "message": f"no segment of {broker_name} holds offset {commit_log_offset} (retention deleted it?)"}}
