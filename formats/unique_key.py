"""UNIQ_KEY, the client msgId, as RocketMQ 4.x `MessageClientIDSetter` builds and reads it,
and the time held by a RocketMQ 5.x client id.

4.x id = hex(ip ‖ (short)pid ‖ (int)classLoaderHash) ‖ hex32(ms since the producer's month
start, in its time zone) ‖ hex16(counter): 32 characters for IPv4, 56 for IPv6.
5.x id = "01" ‖ hex(MAC 6) ‖ hex(pid 2) ‖ hex32(s since 2021-01-01 00:00 local) ‖ hex32(seq).
"""
from __future__ import annotations

import ipaddress
import itertools
import struct
import threading
import time
from datetime import datetime, tzinfo
from typing import Callable

from quarry.formats.hex_codec import bytes2string

V5_LENGTH = 34
V5_EPOCH_UTC_MS = 1609459200000  # 2021-01-01T00:00:00Z; the producer's zone shifts it by up to ±14 h


class UniqueKeyError(ValueError):
    """An id that does not have the 4.x or 5.x layout."""


def _month_start(now_ms: int, tz: tzinfo, months_back: int = 0) -> int:
    local = datetime.fromtimestamp(now_ms / 1000.0, tz)
    year, month = local.year, local.month - months_back
    while month < 1:
        month += 12
        year -= 1
    return int(datetime(year, month, 1, tzinfo=tz).timestamp() * 1000)


def _next_month_start(start_ms: int, tz: tzinfo) -> int:
    local = datetime.fromtimestamp(start_ms / 1000.0, tz)
    year, month = (local.year + 1, 1) if local.month == 12 else (local.year, local.month + 1)
    return int(datetime(year, month, 1, tzinfo=tz).timestamp() * 1000)


def _ip_bytes(ip: str | bytes) -> bytes:
    if isinstance(ip, bytes):
        return ip
    return ipaddress.ip_address(ip).packed


class UniqueKeyGenerator:
    """Makes 4.x UNIQ_KEYs for one producer (thread-safe), exactly as MessageClientIDSetter."""

    def __init__(
        self,
        ip: str | bytes,
        pid: int,
        class_loader_hash: int,
        tz: tzinfo,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.tz = tz
        self.clock = clock or (lambda: int(time.time() * 1000))
        self.fix = bytes2string(_ip_bytes(ip) + struct.pack(">hi", _wrap(pid, 16), _wrap(class_loader_hash, 32)))
        self._lock = threading.Lock()
        self._counter = itertools.count()
        self._set_start(self.clock())

    def _set_start(self, now_ms: int) -> None:
        self.start_time = _month_start(now_ms, self.tz)
        self.next_start_time = _next_month_start(self.start_time, self.tz)

    def set_counter(self, value: int) -> None:
        """Continue the counter from `value` (the class-wide AtomicInteger in RocketMQ)."""
        with self._lock:
            self._counter = itertools.count(value)

    def next_id(self) -> str:
        """The next id: fixed prefix, ms since month start, low 16 bits of the counter."""
        with self._lock:
            now = self.clock()
            if now >= self.next_start_time:
                self._set_start(now)
            diff = _wrap(now - self.start_time, 32)
            if -1_000_000 < diff < 0:
                diff = 0
            counter = next(self._counter)
        return f"{self.fix}{diff & 0xFFFFFFFF:08X}{counter & 0xFFFF:04X}"


def _wrap(value: int, bits: int) -> int:
    """Java's narrowing cast to a signed int of `bits` bits."""
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def _raw(uid: str) -> bytes:
    if len(uid) % 2:
        raise UniqueKeyError(f"unique key must have an even number of hex characters, got {len(uid)}")
    try:
        return bytes.fromhex(uid)
    except ValueError:
        raise UniqueKeyError("unique key must be hexadecimal (0-9, A-F)") from None


def id_kind(uid: str) -> str:
    """'v4' (32 or 56 hex), 'v5' (34 hex starting 01), or '' when neither layout fits."""
    try:
        _raw(uid)
    except UniqueKeyError:
        return ""
    if len(uid) in (32, 56):
        return "v4"
    if len(uid) == V5_LENGTH and uid.startswith("01"):
        return "v5"
    return ""


def _ip_len(raw: bytes) -> int:
    return 16 if len(raw) == 28 else 4


def time_span_ms(uid: str) -> int:
    """The unsigned 32-bit 'ms since month start' field of a 4.x id."""
    raw = _raw(uid)
    at = _ip_len(raw) + 6
    if len(raw) < at + 4:
        raise UniqueKeyError(f"unique key too short for a 4.x id: {len(uid)} hex characters")
    return int.from_bytes(raw[at:at + 4], "big")


def nearly_time_from_id(uid: str, now_ms: int, tz: tzinfo) -> int:
    """getNearlyTimeFromID: month start of `now` in `tz` plus the id's span, or the previous
    month's when that is not before now (the test is >=, as RocketMQ's)."""
    span = time_span_ms(uid)
    start = _month_start(now_ms, tz)
    if start + span >= now_ms:
        start = _month_start(now_ms, tz, months_back=1)
    return start + span


def ip_str_from_id(uid: str) -> str:
    """getIPStrFromID: dotted IPv4, or IPv6 as eight zero-padded groups."""
    raw = _raw(uid)
    ip = raw[:_ip_len(raw)]
    if len(ip) == 4:
        return ".".join(str(b) for b in ip)
    return ":".join(ip[i:i + 2].hex() for i in range(0, 16, 2))


def pid_from_id(uid: str) -> int:
    """getPidFromID: the unsigned 16-bit pid field."""
    raw = _raw(uid)
    at = _ip_len(raw)
    return int.from_bytes(raw[at:at + 2], "big")


def v5_time_ms(uid: str) -> int:
    """Approximate creation time of a 5.x id, as if its producer ran in UTC (±14 h otherwise)."""
    if id_kind(uid) != "v5":
        raise UniqueKeyError("not a 5.x client id (34 hex characters starting with 01)")
    seconds = int(uid[18:26], 16)
    return V5_EPOCH_UTC_MS + seconds * 1000


__all__ = [
    "UniqueKeyGenerator", "UniqueKeyError", "id_kind", "time_span_ms", "nearly_time_from_id",
    "ip_str_from_id", "pid_from_id", "v5_time_ms",
]
