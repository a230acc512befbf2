"""IndexFile against every scenario of golden/indexfile/: bytes after each step, query results,
reload. Scenarios are discovered from the directory."""
from __future__ import annotations

import hashlib
import shutil
import struct
from pathlib import Path

import pytest

from quarry.formats.index_file import HEADER_SIZE, IndexFile
from tests.vectors import glob, golden_cases, golden_root, load_json


def _scenarios(root: Path) -> list[object]:
    return [pytest.param(p, id=p.stem) for p in glob("indexfile/*.json")]


def _load(p: Path) -> dict:
    return load_json(p.relative_to(golden_root()))


def _header(data: bytes) -> dict:
    bt, et, bp, ep, hsc, ic = struct.unpack_from(">qqqqii", data, 0)
    return {"begin_timestamp": bt, "end_timestamp": et, "begin_phy_offset": bp, "end_phy_offset": ep, "hash_slot_count": hsc, "index_count": ic}


def _build(scenario: dict, path: Path, check_steps: bool) -> IndexFile:
    ctor = scenario["constructor"]
    f = IndexFile(path, scenario["hash_slot_num"], scenario["index_num"], ctor["end_phy_offset"], ctor["end_timestamp"])
    if check_steps and "header_after_constructor" in scenario:
        assert _header(path.read_bytes()) == scenario["header_after_constructor"]
    slots = scenario["hash_slot_num"]
    for put in scenario["puts"]:
        assert f.put_key(put["key"], put["phy_offset"], put["store_timestamp"]) == put["returned"], put["seq"]
        if not check_steps:
            continue
        data = path.read_bytes()
        if put.get("header_after"):
            assert _header(data) == put["header_after"], put["seq"]
        if put["returned"]:
            pos = HEADER_SIZE + 4 * slots + 20 * put["entry_no"]
            e = put["entry"]
            assert struct.unpack_from(">iqii", data, pos) == (e["key_hash"], e["phy_offset"], e["time_diff"], e["prev_index"]), put["seq"]
            assert struct.unpack_from(">i", data, HEADER_SIZE + 4 * put["slot"])[0] == put["entry_no"]
    return f


@golden_cases("scenario_path", _scenarios)
def test_file_bytes_equal_golden_image_at_each_step(scenario_path: Path, tmp_path: Path) -> None:
    scenario = _load(scenario_path)
    path = tmp_path / "index"
    f = _build(scenario, path, check_steps=True)
    before = golden_root() / "indexfile" / f"{scenario_path.stem}.before_flush.bin"
    if before.exists():
        assert path.read_bytes() == before.read_bytes()
    f.flush()
    data = path.read_bytes()
    assert len(data) == scenario["file_size"]
    assert hashlib.sha256(data).hexdigest() == scenario["file_sha256"]
    assert data == (golden_root() / "indexfile" / scenario["file"]).read_bytes()
    assert _header(data) == scenario["header_final"]
    g = scenario["getters_final"]
    assert (f.header.begin_timestamp, f.header.end_timestamp, f.header.end_phy_offset, f.is_write_full()) == (
        g["begin_timestamp"], g["end_timestamp"], g["end_phy_offset"], g["is_write_full"])
    f.close()


@golden_cases("scenario_path", _scenarios)
def test_queries_equal_golden_results_live_and_after_reload(scenario_path: Path, tmp_path: Path) -> None:
    scenario = _load(scenario_path)
    path = tmp_path / "index"
    f = _build(scenario, path, check_steps=False)
    f.flush()
    for q in scenario["queries"]:
        assert f.select_phy_offsets(q["key"], q["max_num"], q["begin"], q["end"]) == q["result"], q.get("note")
        assert f.is_time_matched(q["begin"], q["end"]) == q["is_time_matched"], q.get("note")
    f.close()
    if scenario.get("reload_queries_identical"):
        again = IndexFile(path, scenario["hash_slot_num"], scenario["index_num"], read_only=True)
        for q in scenario["queries"]:
            assert again.select_phy_offsets(q["key"], q["max_num"], q["begin"], q["end"]) == q["result"]
        again.close()


@golden_cases("scenario_path", _scenarios)
def test_read_only_open_of_golden_image_changes_no_byte(scenario_path: Path, tmp_path: Path) -> None:
    scenario = _load(scenario_path)
    copy = tmp_path / scenario["file"]
    shutil.copy(golden_root() / "indexfile" / scenario["file"], copy)
    digest = hashlib.sha256(copy.read_bytes()).hexdigest()
    f = IndexFile(copy, scenario["hash_slot_num"], scenario["index_num"], read_only=True)
    for q in scenario["queries"]:
        assert f.select_phy_offsets(q["key"], q["max_num"], q["begin"], q["end"]) == q["result"]
    f.flush()
    f.close()
    assert hashlib.sha256(copy.read_bytes()).hexdigest() == digest


@golden_cases("scenario_path", _scenarios)
def test_batch_put_gives_the_same_bytes_as_single_puts(scenario_path: Path, tmp_path: Path) -> None:
    scenario = _load(scenario_path)
    ctor = scenario["constructor"]
    f = IndexFile(tmp_path / "index", scenario["hash_slot_num"], scenario["index_num"], ctor["end_phy_offset"], ctor["end_timestamp"])
    items = [(p["key"], p["phy_offset"], p["store_timestamp"]) for p in scenario["puts"]]
    assert f.put_keys(items) == sum(p["returned"] for p in scenario["puts"])
    f.flush()
    f.close()
    assert (tmp_path / "index").read_bytes() == (golden_root() / "indexfile" / scenario["file"]).read_bytes()
