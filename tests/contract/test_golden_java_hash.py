"""Java String.hashCode, IndexFile key hash and slot against every case of golden/java_hash.json."""
from __future__ import annotations

import json

import pytest

from quarry.formats.java_hash import index_key_hash, java_string_hash
from tests.conftest import golden_root

DATA = json.loads((golden_root() / "java_hash.json").read_text())


@pytest.mark.parametrize("case", DATA["cases"], ids=[f"{i}:{c['key'][:20]!r}" for i, c in enumerate(DATA["cases"])])
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

    keys = [c["key"] for c in DATA["cases"]]
    assert java_string_hashes(keys) == [c["string_hash"] for c in DATA["cases"]]
    assert index_key_hashes(keys) == [c["index_key_hash"] for c in DATA["cases"]]
    ascii_keys = [k for k in keys if k.isascii()]
    assert java_string_hashes(ascii_keys) == [c["string_hash"] for c in DATA["cases"] if c["key"].isascii()]
