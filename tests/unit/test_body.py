"""A record's body as its reader gets it (formats/body.py): inflated when the sysFlag says
zlib, as stored otherwise, never an error in an answer."""
from __future__ import annotations

import zlib

import pytest

from quarry.formats.body import BodyError, inflate, readable_body

TEXT = b"order 42 paid " * 400
PACKED = zlib.compress(TEXT)


@pytest.mark.parametrize("sys_flag", [0x1, 0x1 | 0x3 << 8, 0x1 | 0x8 | 0x3 << 8])  # zlib: no codec bits (before 4.9), ZLIB, with a commit flag
def test_a_zlib_body_is_inflated(sys_flag: int) -> None:
    assert readable_body(PACKED, sys_flag) == TEXT


@pytest.mark.parametrize("sys_flag, body", [
    (0x0, PACKED),  # not compressed: the bytes are the body, whatever they look like
    (0x1 | 0x1 << 8, PACKED),  # LZ4
    (0x1 | 0x2 << 8, PACKED),  # ZSTD
    (0x1, b"not zlib at all"),  # says compressed, does not inflate: as stored, the flag tells
])
def test_anything_else_is_given_as_stored(sys_flag: int, body: bytes) -> None:
    assert readable_body(body, sys_flag) == body


def test_a_body_inflating_past_the_limit_is_given_as_stored() -> None:
    bomb = zlib.compress(bytes(1 << 20))
    assert readable_body(bomb, 0x1, limit=1000) == bomb
    with pytest.raises(BodyError) as err:
        inflate(bomb, 1000)
    assert err.value.too_big and "1000" in err.value.reason
    with pytest.raises(BodyError) as bad:
        inflate(b"\x78\x9c garbage", 1000)
    assert not bad.value.too_big and "does not inflate" in bad.value.reason
