"""offsetMsgId create/decode against every case of golden/msgid.json (IPv4, IPv6, mapped, errors)."""
from __future__ import annotations

import json

import pytest

from quarry.formats import offset_msg_id
from tests.conftest import golden_root

DATA = json.loads((golden_root() / "msgid.json").read_text())


@pytest.mark.parametrize("case", DATA["create"], ids=[c["msg_id"] for c in DATA["create"]])
def test_create(case: dict) -> None:
    msg_id = offset_msg_id.create(case["input_host"], case["port"], case["offset"])
    assert msg_id == case["msg_id"] and len(msg_id) == case["msg_id_length"]
    assert offset_msg_id.ip_bytes(case["input_host"]).hex() == case["ip_bytes_hex"]
    decoded = offset_msg_id.decode(msg_id)
    assert (decoded.ip, decoded.port, decoded.offset) == (case["decoded"]["ip"], case["decoded"]["port"], case["decoded"]["offset"])


@pytest.mark.parametrize("case", DATA["decode"], ids=[c["msg_id"] or "empty" for c in DATA["decode"]])
def test_decode(case: dict) -> None:
    want = case["decoded"]
    if want["ok"]:
        got = offset_msg_id.decode(case["msg_id"])
        assert (got.ip, got.port, got.offset) == (want["ip"], want["port"], want["offset"])
        assert got.is_ipv6 == (want["ip_family"] == "ipv6")
    else:
        with pytest.raises(offset_msg_id.OffsetMsgIdError):
            offset_msg_id.decode(case["msg_id"])
