"""offsetMsgId create/decode against every case of golden/msgid.json (IPv4, IPv6, mapped, errors)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from quarry.formats import offset_msg_id
from tests.vectors import golden_cases, load_json


def _create(root: Path) -> list[Any]:
    return [pytest.param(c, id=c["msg_id"]) for c in load_json("msgid.json")["create"]]


def _decode(root: Path) -> list[Any]:
    return [pytest.param(c, id=c["msg_id"] or "empty") for c in load_json("msgid.json")["decode"]]


@golden_cases("case", _create)
def test_create(case: dict) -> None:
    msg_id = offset_msg_id.create(case["input_host"], case["port"], case["offset"])
    assert msg_id == case["msg_id"] and len(msg_id) == case["msg_id_length"]
    assert offset_msg_id.formatter(case["input_host"], case["port"])(case["offset"]) == msg_id  # the store's per-host form
    assert offset_msg_id.ip_bytes(case["input_host"]).hex() == case["ip_bytes_hex"]
    decoded = offset_msg_id.decode(msg_id)
    assert (decoded.ip, decoded.port, decoded.offset) == (case["decoded"]["ip"], case["decoded"]["port"], case["decoded"]["offset"])


@golden_cases("case", _decode)
def test_decode(case: dict) -> None:
    want = case["decoded"]
    if want["ok"]:
        got = offset_msg_id.decode(case["msg_id"])
        assert (got.ip, got.port, got.offset) == (want["ip"], want["port"], want["offset"])
        assert got.is_ipv6 == (want["ip_family"] == "ipv6")
    else:
        with pytest.raises(offset_msg_id.OffsetMsgIdError):
            offset_msg_id.decode(case["msg_id"])
