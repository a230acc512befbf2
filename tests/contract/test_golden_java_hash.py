"""Java String.hashCode, IndexFile key hash and slot against every case of golden/java_hash.json."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from quarry.formats.java_hash import index_key_hash, java_string_hash
from tests.vectors import golden_cases, load_json


def _cases(root: Path) -> list[Any]:
    cases = load_json("java_hash.json")["cases"]
    return [pytest.param(c, id=f"{i}:{c['key'][:20]!r}") for i, c in enumerate(cases)]


@golden_cases("case", _cases)
def test_hashes_and_slots(case: dict) -> None:
    key = case["key"]
    assert java_string_hash(key) == case["string_hash"]
    assert index_key_hash(key) == case["index_key_hash"]
    for slots, slot in case["slot"].items():
        assert index_key_hash(key) % int(slots) == slot
    units = len(key.encode("utf-16-le", "surrogatepass")) // 2
    assert units == case["utf16_length"]
    if case.get("utf8_hex") is not None:
        assert key.encode("utf-8").hex() == case["utf8_hex"]


def test_batch_hashes_equal_every_golden_case() -> None:
    from quarry.formats.java_hash_batch import index_key_hashes, java_string_hashes

    cases = load_json("java_hash.json")["cases"]
    assert cases, "java_hash.json holds no case"
    keys = [c["key"] for c in cases]
    assert java_string_hashes(keys) == [c["string_hash"] for c in cases]
    assert index_key_hashes(keys) == [c["index_key_hash"] for c in cases]
    ascii_keys = [k for k in keys if k.isascii()]
    assert java_string_hashes(ascii_keys) == [c["string_hash"] for c in cases if c["key"].isascii()]
