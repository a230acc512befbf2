"""BODYCRC's CRC32 has one home (quarry.formats.crc): it must be zlib's (Java's CRC32) bit for
bit, on every buffer type the send path hands it, and no other module may compute a body CRC
with a CRC32 of its own."""
from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
import zlib
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from quarry.formats.crc import crc32
from quarry.formats.record import body_crc


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=5000))
def test_crc32_is_zlibs(body: bytes) -> None:
    want = zlib.crc32(body)
    assert crc32(body) == want
    assert crc32(bytearray(body)) == want
    assert crc32(memoryview(b"x" + body)[1:]) == want


def test_crc32_of_large_and_aligned_bodies() -> None:
    # ISA-L folds 16/64-byte blocks: lengths around block edges and a body of several MB.
    data = bytes(range(256)) * 20_000
    for n in (0, 1, 15, 16, 17, 63, 64, 65, 255, 256, 1023, 1024, 1025, 4096, 65_537, len(data)):
        assert crc32(data[:n]) == zlib.crc32(data[:n]), n


def test_body_crc_of_an_empty_body_is_zero() -> None:
    assert body_crc(b"") == 0
    assert body_crc(b"\x00") == zlib.crc32(b"\x00") & 0x7FFFFFFF


def _quarry_sources() -> list[Path]:
    files = []
    for root in ("formats", "services", "clients", "pipeline"):
        package = importlib.import_module(f"quarry.{root}")
        files.append(Path(package.__file__ or ""))
        for info in pkgutil.walk_packages(package.__path__, f"quarry.{root}."):
            spec = importlib.util.find_spec(info.name)
            assert spec is not None and spec.origin is not None
            files.append(Path(spec.origin))
    return files


def test_no_module_but_formats_crc_has_a_crc32_of_its_own() -> None:
    """zlib.crc32 / binascii.crc32 / isal's crc32 anywhere else would be a second CRC rule."""
    offenders = []
    for path in _quarry_sources():
        if path.name == "crc.py" and path.parent.name == "formats":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr == "crc32":
                offenders.append(f"{path}:{node.lineno}")
            elif isinstance(node, ast.ImportFrom) and node.module != "quarry.formats.crc" and any(a.name == "crc32" for a in node.names):
                offenders.append(f"{path}:{node.lineno}")
    assert not offenders, offenders
