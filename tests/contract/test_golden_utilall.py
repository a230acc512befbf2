"""UtilAll's hex codec and BODYCRC against every case of golden/utilall.json.

`bytes2string`/`string2bytes` live in formats/hex_codec.py (the ids are written with it);
BODYCRC (`UtilAll.crc32`) is formats/record.py's `body_crc`, the one the commitlog stores.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from quarry.formats.hex_codec import bytes2string, string2bytes
from quarry.formats.record import body_crc
from tests.vectors import golden_cases, load_json


def _hex(op: str) -> Any:
    def discover(root: Path) -> list[Any]:
        cases = [c for c in load_json("utilall.json")["hex"] if c["op"] == op]
        return [pytest.param(c, id=repr(c.get("input", c.get("input_hex")))) for c in cases]
    return discover


def _crc(root: Path) -> list[Any]:
    return [pytest.param(c, id=f"{i}:len={c.get('body_len')}") for i, c in enumerate(load_json("utilall.json")["crc32"])]


def _body(case: dict) -> bytes | None:
    if "body_hex" in case:
        return bytes.fromhex(case["body_hex"])
    if "body_utf8" in case:
        return case["body_utf8"].encode("utf-8")
    assert case.get("body", "absent") is None, f"case has no body field: {sorted(case)}"
    return None


@golden_cases("case", _hex("bytes2string"))
def test_bytes2string(case: dict) -> None:
    assert bytes2string(bytes.fromhex(case["input_hex"])) == case["output"]


@golden_cases("case", _hex("string2bytes"))
def test_string2bytes(case: dict) -> None:
    got = string2bytes(case["input"])
    assert (None if got is None else got.hex()) == case["output_hex"]


@golden_cases("case", _crc)
def test_body_crc_is_utilall_crc32(case: dict) -> None:
    body = _body(case)
    if body is None:  # UtilAll.crc32(null): a message without a body
        assert body_crc(b"") == case["utilall_crc32_of_null"]
        return
    assert len(body) == case["body_len"]
    assert body_crc(body) == case["utilall_crc32"]
    assert case["utilall_crc32"] == case["crc32_unmasked"] & 0x7FFFFFFF

