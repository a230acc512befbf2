"""UNIQ_KEY against RocketMQ 4.9.8's MessageClientIDSetter: every producer call and every
getNearlyTimeFromID case in golden/uniqid.json."""
from __future__ import annotations

from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from quarry.formats.unique_key import UniqueKeyGenerator, ip_str_from_id, nearly_time_from_id, pid_from_id
from tests.vectors import golden_cases, load_json


def _producers(root: Path) -> list[Any]:
    return [pytest.param(p, id=p["name"]) for p in load_json("uniqid.json")["producers"]]


def _nearly_time(root: Path) -> list[Any]:
    return [
        pytest.param(n["producer"], i, c, id=f"{n['producer']}-{i}")
        for n in load_json("uniqid.json")["nearly_time"] for i, c in enumerate(n["cases"])
    ]


@golden_cases("producer", _producers)
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


@golden_cases("producer, i, case", _nearly_time)
def test_nearly_time_matches_every_case(producer: str, i: int, case: dict) -> None:
    assert nearly_time_from_id(case["id"], case["now_ms"], ZoneInfo(case["timezone"])) == case["result_ms"]
