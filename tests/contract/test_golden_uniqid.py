"""UNIQ_KEY against RocketMQ 4.9.8's MessageClientIDSetter: every producer call and every
getNearlyTimeFromID case in golden/uniqid.json."""
from __future__ import annotations

import json
from zoneinfo import ZoneInfo

import pytest

from quarry.formats.unique_key import UniqueKeyGenerator, ip_str_from_id, nearly_time_from_id, pid_from_id
from tests.conftest import golden_root

DATA = json.loads((golden_root() / "uniqid.json").read_text())


@pytest.mark.parametrize("producer", DATA["producers"], ids=[p["name"] for p in DATA["producers"]])
def test_generator_reproduces_every_call(producer: dict) -> None:
    clock = {"now": producer["init_now_ms"]}
    gen = UniqueKeyGenerator(producer["ip"], producer["pid"], producer["class_loader_hash"], ZoneInfo(producer["timezone"]), lambda: clock["now"])
    assert gen.fix == producer["fix_string"]
    assert (gen.start_time, gen.next_start_time) == (producer["start_time_ms"], producer["next_start_time_ms"])
    for call in producer["calls"]:
        clock["now"] = call["now_ms"]
        # The golden counter may jump (wrap cases): continue from the recorded value.
        gen.set_counter(call["counter_before"])
        assert gen.next_id() == call["id"], call["now_local"]
        assert (gen.start_time, gen.next_start_time) == (call["start_time_after_ms"], call["next_start_time_after_ms"])
        assert ip_str_from_id(call["id"]) == call["getIPStrFromID"]
        assert pid_from_id(call["id"]) == call["getPidFromID"]


CASES = [(n["producer"], i, c) for n in DATA["nearly_time"] for i, c in enumerate(n["cases"])]


@pytest.mark.parametrize(("producer", "i", "case"), CASES, ids=[f"{p}-{i}" for p, i, _ in CASES])
def test_nearly_time_matches_every_case(producer: str, i: int, case: dict) -> None:
    assert nearly_time_from_id(case["id"], case["now_ms"], ZoneInfo(case["timezone"])) == case["result_ms"]
