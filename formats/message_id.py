"""What a message id holds, read offline (mqadmin's DecodeMessageId, extended).

An id of 32 or 56 hex characters may be an offsetMsgId (store host + commit log offset) or a
4.x unique key (producer IP, pid, class-loader hash, time, counter): both layouts have those
lengths, so both readings are given. A 34-character id starting with 01 is a 5.x unique key
(MAC, pid, seconds since 2021-01-01 in the producer's zone, sequence).
"""
from __future__ import annotations

from datetime import tzinfo
from typing import Any

from quarry.formats import offset_msg_id, unique_key


class MessageIdError(ValueError):
    """An id that fits no layout; the message says why."""


def describe(msg_id: str, now_ms: int, tz: tzinfo) -> dict[str, Any]:
    """Every reading of `msg_id` that its layout allows, keyed by kind."""
    text = msg_id.strip()
    if not text:
        raise MessageIdError("message id is empty")
    out: dict[str, Any] = {"id": text}
    kind = unique_key.id_kind(text)
    if kind == "":
        raise MessageIdError(f"{text!r}: expected 32 or 56 hex characters (offsetMsgId or 4.x unique key) "
                             f"or 34 starting with 01 (5.x unique key), got {len(text)} characters")
    if kind == "v4":
        try:
            d = offset_msg_id.decode(text)
            out["offset_msg_id"] = {"store_host": f"[{d.ip}]:{d.port}" if d.is_ipv6 else f"{d.ip}:{d.port}",
                                    "ip": d.ip, "port": d.port, "commit_log_offset": d.offset}
        except ValueError as exc:
            out["offset_msg_id"] = {"error": str(exc)}
        raw = bytes.fromhex(text)
        ip_len = 16 if len(raw) == 28 else 4
        at = ip_len + 2
        out["unique_key_v4"] = {
            "ip": unique_key.ip_str_from_id(text),
            "pid": unique_key.pid_from_id(text),
            "class_loader_hash": int.from_bytes(raw[at:at + 4], "big", signed=True),
            "ms_since_month_start": unique_key.time_span_ms(text),
            "nearly_time_ms": unique_key.nearly_time_from_id(text, now_ms, tz),
            "counter": int.from_bytes(raw[at + 8:at + 10], "big"),
        }
    else:
        raw = bytes.fromhex(text)
        out["unique_key_v5"] = {
            "version": raw[0],
            "mac": ":".join(f"{b:02x}" for b in raw[1:7]),
            "pid": int.from_bytes(raw[7:9], "big"),
            "seconds_since_2021": int.from_bytes(raw[9:13], "big"),
            "time_ms_if_utc": unique_key.v5_time_ms(text),
            "sequence": int.from_bytes(raw[13:17], "big"),
        }
    return out
