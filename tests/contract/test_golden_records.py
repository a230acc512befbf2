"""CommitLog records, segments and the recovery walk against every scenario in golden/messages/.

Scenarios are discovered from the directory, so new vectors are picked up without changes.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from quarry.formats import offset_msg_id
from quarry.formats.body import readable_body
from quarry.formats.consume_queue import CQ_UNIT_SIZE, decode_unit, encode_unit
from quarry.formats.batch_body import batch_record_properties, decode_batch_body
from quarry.formats.dispatch import decode_dispatch, dispatch_info
from quarry.formats.record import decode_record, encode_record
from quarry.formats.segment_walk import SegmentEnd, WalkResult, list_segments, walk_buffer, walk_segments
from tests.vectors import glob, golden_cases, golden_root, load_json


def _scenario_dirs() -> list[Path]:
    return [p.parent for p in glob("messages/*/scenario.json")]


def _load(d: Path) -> dict:
    return load_json(d.relative_to(golden_root()) / "scenario.json")


def _scenarios(root: Path) -> list[Any]:
    return [pytest.param(d, id=d.name) for d in _scenario_dirs()]


def _records(root: Path) -> list[Any]:
    return [
        pytest.param(d.name, m, i, r, id=f"{d.name}-{m['seq']}-{i}")
        for d in _scenario_dirs() for m in _load(d)["messages"] for i, r in enumerate(m["records"])
    ]


def _batches(root: Path) -> list[Any]:
    return [pytest.param(m, id=f"{d.name}-{m['seq']}") for d in _scenario_dirs() for m in _load(d)["messages"] if m["kind"] == "batch"]


def _host(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


def _java_host(host: tuple[str, int]) -> str:
    return f"{host[0]}:{host[1]}"


@golden_cases("scenario, message, index, record", _records)
def test_encode_reproduces_golden_bytes(scenario: str, message: dict, index: int, record: dict) -> None:
    inp = message["input"]
    decoded = record["decoded"]
    if message["kind"] == "batch":
        inner = inp["messages"][index]
        flag, body = inner["flag"], bytes.fromhex(inner["body_hex"])
        props = batch_record_properties(inner["properties_string"], inp["batch_properties_string"])
        topic, queue_id, sys_flag, reconsume, prepared = inp["topic"], inp["queue_id"], 0, 0, 0
    else:
        after = message["after_put"]
        flag, body, props = inp["flag"], bytes.fromhex(inp["body_hex"]), after["properties_string"]
        topic, queue_id, sys_flag = after["topic"], after["queue_id"], after["sys_flag"]
        reconsume, prepared = inp["reconsume_times"], inp["prepared_transaction_offset"]
    assert props == record["stored_properties_string"]
    out = encode_record(
        topic=topic, body=body, properties=props, queue_id=queue_id, flag=flag,
        queue_offset=decoded["queue_offset"], physical_offset=record["offset"], sys_flag=sys_flag,
        born_timestamp=inp["born_timestamp"], born_host=_host(inp["born_host"]),
        store_timestamp=inp["store_clock"], store_host=_host(inp["store_host"]),
        reconsume_times=reconsume, prepared_transaction_offset=prepared,
    )
    assert out.hex() == record["hex"]
    assert len(out) == record["size"]


@golden_cases("scenario, message, index, record", _records)
def test_decode_matches_golden_fields(scenario: str, message: dict, index: int, record: dict) -> None:
    rec = decode_record(bytes.fromhex(record["hex"]), physical_offset=record["offset"])
    want = record["decoded"]
    assert rec.store_size == want["store_size"] and rec.body_crc == want["body_crc"]
    assert (rec.queue_id, rec.flag, rec.queue_offset, rec.physical_offset, rec.sys_flag) == (
        want["queue_id"], want["flag"], want["queue_offset"], want["commit_log_offset"], want["sys_flag"])
    assert (rec.born_timestamp, rec.store_timestamp) == (want["born_timestamp"], want["store_timestamp"])
    assert _java_host(rec.born_host) == want["born_host"] and _java_host(rec.store_host) == want["store_host"]
    assert (rec.reconsume_times, rec.prepared_transaction_offset) == (want["reconsume_times"], want["prepared_transaction_offset"])
    assert rec.body.hex() == record.get("decoded_body_not_decompressed_hex", want["body_hex"])
    assert readable_body(rec.body, rec.sys_flag).hex() == want["body_hex"]  # as MessageDecoder.decode inflates it
    assert rec.topic == want["topic"]
    assert (rec.properties if rec.properties_text else None) == want["properties"]  # PROPLEN 0 decodes to null
    assert [list(p) for p in rec.properties_pairs] == record["stored_properties_pairs"]
    assert rec.offset_msg_id == want["msg_id"]
    assert rec.keys_text == want.get("keys") and rec.tags == want.get("tags") and rec.unique_key == want.get("uniq_key")
    assert offset_msg_id.decode(rec.offset_msg_id).offset == record["offset"]

    dispatch = record["dispatch"]
    info = dispatch_info(rec)
    assert decode_dispatch(bytes.fromhex(record["hex"]), 0, record["offset"]) == info  # the Tail's light decoder
    assert dispatch["success"]
    assert (info.size, info.topic, info.queue_id, info.physical_offset, info.store_timestamp, info.queue_offset) == (
        dispatch["msg_size"], dispatch["topic"], dispatch["queue_id"], dispatch["commit_log_offset"], dispatch["store_timestamp"], dispatch["consume_queue_offset"])
    assert (info.tags_code, info.keys, info.unique_key, info.sys_flag, info.prepared_transaction_offset) == (
        dispatch["tags_code"], dispatch["keys"], dispatch["uniq_key"], dispatch["sys_flag"], dispatch["prepared_transaction_offset"])


@golden_cases("scenario_dir", _scenarios)
def test_segment_walk_equals_recovery_walk(scenario_dir: Path) -> None:
    scenario = _load(scenario_dir)
    result = WalkResult()
    got = [dispatch_info(r) for r in walk_segments(scenario_dir / "commitlog", result=result)]
    want = scenario["recovery_walk"]
    assert [
        {"physical_offset": g.physical_offset, "size": g.size, "topic": g.topic, "queue_id": g.queue_id, "consume_queue_offset": g.queue_offset,
         "tags_code": g.tags_code, "keys": g.keys, "uniq_key": g.unique_key, "store_timestamp": g.store_timestamp, "sys_flag": g.sys_flag}
        for g in got
    ] == want
    assert result.corruption is None
    assert result.end_offset == scenario["max_offset"]
    assert list_segments(scenario_dir / "commitlog")[0][0] == scenario["min_offset"]


@golden_cases("scenario_dir", _scenarios)
def test_segments_end_where_golden_says(scenario_dir: Path) -> None:
    scenario = _load(scenario_dir)
    for seg in scenario["segments"]:
        path = scenario_dir / "commitlog" / Path(seg["file"]).name
        data = path.read_bytes()
        assert len(data) == seg["size"] == scenario["segment_size"]
        assert hashlib.sha256(data).hexdigest() == seg["sha256"]
        end = SegmentEnd(0)
        list(walk_buffer(data, seg["start_offset"], 0, True, end))
        assert end.data_end == seg["data_end_in_segment"]
        assert end.blank_at == seg["blank_record_at"]
        assert end.blank_size == seg["blank_record_totalsize"]


@golden_cases("message", _batches)
def test_batch_body_decodes_to_inner_messages(message: dict) -> None:
    items = decode_batch_body(bytes.fromhex(message["input"]["encoded_batch_body_hex"]))
    assert [(i.flag, i.body.hex(), i.properties) for i in items] == [
        (m["flag"], m["body_hex"], m["properties_string"]) for m in message["input"]["messages"]]
    assert message["append"]["msg_id"].split(",") == [r["decoded"]["msg_id"] for r in message["records"]]


@golden_cases("scenario, message, index, record", _records)
def test_consume_queue_unit_is_20_bytes_as_rocketmq_writes_it(scenario: str, message: dict, index: int, record: dict) -> None:
    info = dispatch_info(decode_record(bytes.fromhex(record["hex"])))
    unit = encode_unit(info.physical_offset, info.size, info.tags_code)
    assert len(unit) == CQ_UNIT_SIZE == 20
    assert unit[:8] == info.physical_offset.to_bytes(8, "big")
    assert unit[8:12] == info.size.to_bytes(4, "big")
    assert unit[12:] == info.tags_code.to_bytes(8, "big", signed=True)
    assert decode_unit(unit) == (info.physical_offset, info.size, info.tags_code)
