"""The store-time window searched for a unique key: month boundaries, time zones, clock skew,
RocketMQ 5.x ids, and ids whose time cannot be trusted."""
from __future__ import annotations

from datetime import datetime, timezone
from zoneinfo import ZoneInfo

import pytest

from quarry.formats.unique_key import UniqueKeyGenerator
from quarry.services.query.unique_key_window import TZ_MARGIN_MS, search_window

HOUR = 3_600_000
SKEW = HOUR
FALLBACK = 7 * 24 * HOUR


def _ms(*args: int, tz: timezone | ZoneInfo = timezone.utc) -> int:
    return int(datetime(*args, tzinfo=tz).timestamp() * 1000)  # type: ignore[misc]


def _uid(made_at: int, tz: timezone | ZoneInfo = timezone.utc) -> str:
    return UniqueKeyGenerator("10.0.0.1", 1, 2, tz, lambda: made_at).next_id()


@pytest.mark.parametrize(
    ("made", "now", "tz"),
    [
        (_ms(2026, 3, 15, 10), _ms(2026, 3, 15, 10, 0, 5), timezone.utc),  # same month
        (_ms(2026, 2, 28, 23, 59), _ms(2026, 3, 1, 0, 1), timezone.utc),  # across the month boundary
        (_ms(2026, 2, 10), _ms(2026, 3, 5), timezone.utc),  # last month, well before the boundary
        (_ms(2026, 3, 1, 0, 30, tz=ZoneInfo("Asia/Tokyo")), _ms(2026, 3, 1, 0, 30, tz=ZoneInfo("Asia/Tokyo")) + 60_000, ZoneInfo("Asia/Tokyo")),  # producer east of UTC, new month there only
        (_ms(2026, 2, 28, 20, tz=ZoneInfo("America/New_York")), _ms(2026, 2, 28, 20, tz=ZoneInfo("America/New_York")) + 5_000, ZoneInfo("America/New_York")),  # west of UTC
    ],
)
def test_window_holds_the_creation_time(made: int, now: int, tz: timezone | ZoneInfo) -> None:
    w = search_window(_uid(made, tz), now, SKEW, FALLBACK)
    assert w.trusted and w.begin <= made <= w.end
    assert w.end == now + SKEW


def test_producer_clock_ahead_of_the_broker_is_tolerated() -> None:
    now = _ms(2026, 3, 15, 10)
    made = now + 30 * 60_000  # the producer's clock runs 30 minutes fast
    w = search_window(_uid(made), now, SKEW, FALLBACK)
    assert w.begin <= now <= w.end  # the message is stored "now": inside the window


def test_rocketmq_5_ids_are_widened_by_the_time_zone_ambiguity() -> None:
    now = _ms(2026, 3, 15, 10)
    seconds = (now - _ms(2021, 1, 1)) // 1000
    uid = "01" + "AABBCCDDEEFF" + "1234" + f"{seconds:08X}" + "00000001"
    w = search_window(uid, now, SKEW, FALLBACK)
    assert w.trusted and "5.x" in w.note
    assert w.begin == now - TZ_MARGIN_MS - SKEW
    # A producer 14 h east wrote local midnight-based seconds: still inside.
    assert w.begin <= now - 14 * HOUR <= w.end


@pytest.mark.parametrize("uid", ["not-hex-at-all", "ABC", "01" + "F" * 40, "0" * 33])
def test_untrusted_ids_fall_back_to_a_bounded_window_and_say_so(uid: str) -> None:
    now = _ms(2026, 3, 15, 10)
    w = search_window(uid, now, SKEW, FALLBACK)
    assert not w.trusted and w.begin == now - FALLBACK and w.end == now + SKEW
    assert "cannot be trusted" in w.note


def test_month_offset_beyond_a_month_is_untrusted() -> None:
    uid = "0A000001" + "0001" + "00000002" + "FFFFFFF0" + "0000"  # 4294967280 ms since month start
    w = search_window(uid, _ms(2026, 3, 15), SKEW, FALLBACK)
    assert not w.trusted
