"""Which store-time window to search for a unique key (client msgId).

A 4.x UNIQ_KEY holds milliseconds since the start of the producer's month in the
producer's time zone, which the router does not know; a 5.x id holds seconds since
2021-01-01 in the producer's zone. Both give a time only to within ±14 h, and producer
clocks drift: the window is widened by both, and reaches into the previous month when the
current month's reading is not wholly in the past. An id whose time cannot be read is
searched over a bounded fallback window, and the answer says so.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timezone

from quarry.formats import unique_key

TZ_MARGIN_MS = 14 * 3_600_000  # time zones span UTC-12..UTC+14


@dataclass(frozen=True)
class Window:
    begin: int
    end: int
    trusted: bool
    note: str


def search_window(uid: str, now_ms: int, skew_ms: int, fallback_ms: int) -> Window:
    """The [begin, end] store-time window (epoch ms) in which a message with this id lies."""
    end = now_ms + skew_ms
    fallback = Window(max(0, now_ms - fallback_ms), end, False, "")
    kind = unique_key.id_kind(uid)
    if kind == "v4":
        # Latest reading not after now (+ slack), in UTC month terms.
        latest = unique_key.nearly_time_from_id(uid, now_ms + skew_ms + TZ_MARGIN_MS, timezone.utc)
        begin = latest - TZ_MARGIN_MS - skew_ms
        if latest + TZ_MARGIN_MS > now_ms - skew_ms:
            # This month's reading is partly in the future: the id may be last month's.
            previous = unique_key.nearly_time_from_id(uid, latest, timezone.utc)
            begin = previous - TZ_MARGIN_MS - skew_ms
        if unique_key.time_span_ms(uid) > 31 * 24 * 3_600_000:
            return _untrusted(fallback, uid, "its month offset exceeds a month")
        return Window(max(0, begin), end, True, f"4.x unique key: searched store times {max(0, begin)}..{end} (±14 h zone, ±{skew_ms} ms skew)")
    if kind == "v5":
        t = unique_key.v5_time_ms(uid)
        if t - TZ_MARGIN_MS - skew_ms > now_ms:
            return _untrusted(fallback, uid, "its time lies in the future")
        begin = max(0, t - TZ_MARGIN_MS - skew_ms)
        return Window(begin, min(end, t + TZ_MARGIN_MS + skew_ms), True, f"5.x unique key: searched store times {begin}..{min(end, t + TZ_MARGIN_MS + skew_ms)}")
    return _untrusted(fallback, uid, "it is not a 4.x (32/56 hex) or 5.x (34 hex, '01…') client id")


def _untrusted(fallback: Window, uid: str, why: str) -> Window:
    return Window(fallback.begin, fallback.end, False, f"time of id {uid} cannot be trusted ({why}): searched the bounded window {fallback.begin}..{fallback.end}")
