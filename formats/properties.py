"""Message properties as RocketMQ stores them: `name\\x01value` pairs joined by `\\x02`.

The writer keeps pairs in the order given, empty values included, with no trailing
separator; the reader (`properties_map`) drops pairs with an empty name or value, as
RocketMQ's `string2messageProperties` does.
"""
from __future__ import annotations

NAME_VALUE_SEP = "\x01"
PROPERTY_SEP = "\x02"
MAX_PROPERTIES_BYTES = 32767  # PROPLEN is a signed 16-bit length

KEYS = "KEYS"
TAGS = "TAGS"
UNIQ_KEY = "UNIQ_KEY"
DELAY = "DELAY"
REAL_TOPIC = "REAL_TOPIC"
REAL_QID = "REAL_QID"
CLUSTER = "CLUSTER"
TRAN_MSG = "TRAN_MSG"

Pairs = list[tuple[str, str]]


class PropertyError(ValueError):
    """A property that cannot be stored; the message names the field and the rule."""


def encode_properties(pairs: Pairs) -> str:
    """Join pairs as RocketMQ's messageProperties2String does (no trailing separator)."""
    return PROPERTY_SEP.join([f"{name}\x01{value}" for name, value in pairs])


def decode_pairs(text: str) -> Pairs:
    """Every stored pair in order, empty values kept (a pair without \\x01 is skipped)."""
    pairs: Pairs = []
    if not text:
        return pairs
    for item in text.split(PROPERTY_SEP):
        name, sep, value = item.partition(NAME_VALUE_SEP)
        if sep:
            pairs.append((name, value))
    return pairs


def properties_map(text: str) -> dict[str, str]:
    """The properties as RocketMQ's reader sees them: empty names and values dropped, last wins."""
    return {name: value for name, value in decode_pairs(text) if name and value}


def validate_pairs(pairs: Pairs, field: str = "properties") -> bytes:
    """Check names and values and the encoded size; return the UTF-8 encoding.

    Raises PropertyError naming the offending property and the rule.
    """
    text = encode_properties(pairs)
    # Fast path: with clean names and values the separators appear exactly once per pair.
    if text.count(NAME_VALUE_SEP) == len(pairs) and text.count(PROPERTY_SEP) == max(0, len(pairs) - 1) and all(name for name, _ in pairs):
        encoded = text.encode("utf-8")
        if len(encoded) > MAX_PROPERTIES_BYTES:
            raise PropertyError(f"{field}: encoded properties are {len(encoded)} bytes, at most {MAX_PROPERTIES_BYTES}")
        return encoded
    for i, (name, value) in enumerate(pairs):
        if not name:
            raise PropertyError(f"{field}[{i}].name: must not be empty")
        for what, text in (("name", name), ("value", value)):
            if NAME_VALUE_SEP in text or PROPERTY_SEP in text:
                raise PropertyError(f"{field}[{i}].{what}: must not contain \\x01 or \\x02 (property {name!r})")
    encoded = encode_properties(pairs).encode("utf-8")
    if len(encoded) > MAX_PROPERTIES_BYTES:
        raise PropertyError(f"{field}: encoded properties are {len(encoded)} bytes, at most {MAX_PROPERTIES_BYTES}")
    return encoded


RESERVED = (KEYS, TAGS, UNIQ_KEY)


def message_pairs(keys: list[str], tags: str, unique_key: str, properties: Pairs, field_prefix: str = "") -> tuple[Pairs, str]:
    """A message's stored properties: KEYS (space-joined), TAGS, UNIQ_KEY first, as a RocketMQ
    producer orders them, then the user's; returns (pairs, encoded string). PropertyError
    names the field and the rule."""
    pairs: Pairs = []
    for i, key in enumerate(keys):
        if not key:
            raise PropertyError(f"{field_prefix}keys[{i}]: must not be empty")
        if " " in key:
            raise PropertyError(f"{field_prefix}keys[{i}]: must not contain a space (KEYS are space-separated)")
    if keys:
        pairs.append((KEYS, " ".join(keys)))
    if tags:
        pairs.append((TAGS, tags))
    if unique_key:
        pairs.append((UNIQ_KEY, unique_key))
    for i, (name, _value) in enumerate(properties):
        if name in RESERVED:
            raise PropertyError(f"{field_prefix}properties[{i}].name: {name} is set by its own field (keys, tags, unique_key)")
    pairs.extend(properties)
    encoded = validate_pairs(pairs, f"{field_prefix}properties")
    return pairs, encoded.decode("utf-8")
