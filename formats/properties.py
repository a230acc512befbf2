"""Message properties as RocketMQ stores them: `name\\x01value` pairs joined by `\\x02`.

The writer keeps pairs in the order given, empty values included, with no trailing
separator; the reader (`properties_map`) drops pairs with an empty name or value, as
RocketMQ's `string2messageProperties` does.
"""
from __future__ import annotations

from typing import Any, Sequence

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


def key_tokens(keys: str | None) -> list[str]:
    """The keys of a KEYS property: its space-separated tokens, empty ones dropped as RocketMQ's readers drop them."""
    return [k for k in (keys or "").split(" ") if k]


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


def message_properties(keys: Sequence[str], tags: str, unique_key: str, properties: Sequence[Any], field_prefix: str = "") -> bytes:
    """A message's stored properties, UTF-8 encoded: KEYS (space-joined), TAGS, UNIQ_KEY first,
    as a RocketMQ producer orders them, then the user's (pairs, or objects with `name` and
    `value` such as the protobuf Property). PropertyError names the field and the rule."""
    return stored_properties(keys, tags, unique_key, properties, field_prefix)[0]


def stored_properties(keys: Sequence[str], tags: str, unique_key: str, properties: Sequence[Any],
                      field_prefix: str = "") -> tuple[bytes, str | None]:
    """message_properties, and the KEYS value as stored (None without keys): the send path
    needs both for every message it takes (so this is written for speed: no list per call)."""
    if len(keys) == 1 and not properties:
        # The usual message: one key, no user properties. One text, one check of the three
        # values; anything the check refuses takes the general path below, which names it.
        key = keys[0]
        if tags:
            text = f"KEYS\x01{key}\x02TAGS\x01{tags}\x02UNIQ_KEY\x01{unique_key}" if unique_key else f"KEYS\x01{key}\x02TAGS\x01{tags}"
        else:
            text = f"KEYS\x01{key}\x02UNIQ_KEY\x01{unique_key}" if unique_key else "KEYS\x01" + key
        plain = f"{key}{tags}{unique_key}"
        if key and " " not in key and NAME_VALUE_SEP not in plain and PROPERTY_SEP not in plain:
            encoded = text.encode()
            if len(encoded) <= MAX_PROPERTIES_BYTES:
                return encoded, key
    joined = None
    n = 0
    text = ""
    if keys:
        if len(keys) == 1:  # the usual case: no join, one check
            joined = keys[0]
            bad = not joined or " " in joined
        else:
            keys = list(keys)  # a protobuf repeated field is slow to scan twice
            joined = " ".join(keys)
            # n non-empty keys without spaces join to exactly n-1 spaces.
            bad = joined.count(" ") != len(keys) - 1 or "" in keys
        if bad:
            for i, key in enumerate(keys):
                if not key:
                    raise PropertyError(f"{field_prefix}keys[{i}]: must not be empty")
                if " " in key:
                    raise PropertyError(f"{field_prefix}keys[{i}]: must not contain a space (KEYS are space-separated)")
        text = "KEYS\x01" + joined
        n = 1
    if tags:
        text = f"{text}\x02TAGS\x01{tags}" if n else "TAGS\x01" + tags
        n += 1
    if unique_key:
        text = f"{text}\x02UNIQ_KEY\x01{unique_key}" if n else "UNIQ_KEY\x01" + unique_key
        n += 1
    pairs: Sequence[tuple[str, str]] = ()
    if properties:
        pairs = [p if isinstance(p, tuple) else (p.name, p.value) for p in properties]
        for i, (name, value) in enumerate(pairs):
            if name in RESERVED:
                raise PropertyError(f"{field_prefix}properties[{i}].name: {name} is set by its own field (keys, tags, unique_key)")
            if not name:
                raise PropertyError(f"{field_prefix}properties[{i}].name: must not be empty")
        user = PROPERTY_SEP.join([f"{name}\x01{value}" for name, value in pairs])
        text = f"{text}\x02{user}" if n else user
        n += len(pairs)
    if pairs:
        # With clean names and values each separator appears exactly once per pair.
        bad = text.count(NAME_VALUE_SEP) != n or text.count(PROPERTY_SEP) != n - 1
    else:
        # Only keys, tags and unique key (the usual message): none may hold a separator, which
        # two `in` tests over the three tell in a quarter of the time of counting them in the text.
        plain = f"{joined or ''}{tags}{unique_key}"
        bad = NAME_VALUE_SEP in plain or PROPERTY_SEP in plain
    if bad:
        _raise_separator_error(list(keys), tags, unique_key, pairs, field_prefix)
    encoded = text.encode()
    if len(encoded) > MAX_PROPERTIES_BYTES:
        raise PropertyError(f"{field_prefix}properties: encoded properties are {len(encoded)} bytes, at most {MAX_PROPERTIES_BYTES}")
    return encoded, joined


def _raise_separator_error(keys: list[str], tags: str, unique_key: str, properties: Sequence[tuple[str, str]], field_prefix: str) -> None:
    """Name the field holding a \\x01 or \\x02."""
    fields = [(f"keys[{i}]", k) for i, k in enumerate(keys)] + [("tags", tags), ("unique_key", unique_key)]
    for name, text in fields:
        if NAME_VALUE_SEP in text or PROPERTY_SEP in text:
            raise PropertyError(f"{field_prefix}{name}: must not contain \\x01 or \\x02 (property separators)")
    validate_pairs(list(properties), f"{field_prefix}properties")
    raise AssertionError("separator count mismatch without a separator")  # pragma: no cover


# Names RocketMQ reserves for itself (MessageConst.STRING_HASH_SET): a user property may not
# take one, or the broker would read the user's value as its own.
SHARDING_KEY = "__SHARDINGKEY"
BORN_HOST = "__BORNHOST"
BORN_TIMESTAMP = "BORN_TIMESTAMP"
PRODUCER_GROUP = "PGROUP"
TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
SYSTEM_PROPERTY_NAMES = frozenset({
    "TRACE_ON", "MSG_REGION", KEYS, TAGS, "WAIT", DELAY, "RETRY_TOPIC", REAL_TOPIC, REAL_QID, TRAN_MSG,
    PRODUCER_GROUP, "MIN_OFFSET", "MAX_OFFSET", "BUYER_ID", "ORIGIN_MESSAGE_ID", "TRANSFER_FLAG",
    "CORRECTION_FLAG", "MQ2_FLAG", "RECONSUME_TIME", UNIQ_KEY, "MAX_RECONSUME_TIMES", "CONSUME_START_TIME",
    "POP_CK", "POP_CK_OFFSET", "1ST_POP_TIME", "TRAN_PREPARED_QUEUE_OFFSET", "DUP_INFO", "EXTEND_UNIQ_INFO",
    "INSTANCE_ID", "CORRELATION_ID", "REPLY_TO_CLIENT", "TTL", "ARRIVE_TIME", "PUSH_REPLY_TIME", CLUSTER,
    "MSG_TYPE", "INNER_MULTI_QUEUE_OFFSET", "TIMER_DELAY_MS", "TIMER_DELAY_SEC", TIMER_DELIVER_MS,
    "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS", "TIMER_ROLL_TIMES", "TIMER_OUT_MS", "TIMER_DEL_UNIQKEY",
    "TIMER_DELAY_LEVEL", BORN_HOST, BORN_TIMESTAMP, "DLQ_ORIGIN_TOPIC", "DLQ_ORIGIN_MESSAGE_ID", "__CRC32#",
})
