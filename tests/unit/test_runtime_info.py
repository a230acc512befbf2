"""A broker's runtime figures (services/commitlog/broker/runtime_info.py): rates over RocketMQ's three
windows from once-a-second samples, daily totals as RocketMQ's BrokerStats keeps them, and
RocketMQ's own number formats."""
from __future__ import annotations

from datetime import date

from quarry.services.commitlog.broker.runtime_info import DailyTotals, RateSampler, human_bytes, runtime_text


def test_rates_cover_10s_1min_and_10min_and_are_zero_until_the_window_was_sampled() -> None:
    now, total = [0.0], [0.0]
    s = RateSampler(lambda: total[0], clock=lambda: now[0])
    assert s.rates_text() == "0.00 0.00 0.00"
    for _ in range(61):  # 61 samples a second apart: 60 s sampled, 5 messages a second
        s.sample()
        now[0] += 1
        total[0] += 5
    assert s.rates_text() == "5.00 5.00 0.00"
    for _ in range(10):  # then 10 s at 20 a second
        s.sample()
        now[0] += 1
        total[0] += 20
    # samples at t=60 (300) and t=70 (485): the first step of the 10 s was still at 5 a second
    assert s.rate(10) == 18.5 and s.rate(60) == (485 - 50) / 60


def test_daily_totals_roll_at_local_midnight_as_rocketmqs_broker_stats() -> None:
    day, total = [date(2024, 5, 1)], [0]
    d = DailyTotals(lambda: total[0], today=lambda: day[0])
    total[0] = 7
    d.roll()
    assert (d.yesterday_morning, d.today_morning) == (0, 0)
    day[0], total[0] = date(2024, 5, 2), 9
    d.roll()
    assert (d.yesterday_morning, d.today_morning) == (0, 9)
    day[0], total[0] = date(2024, 5, 3), 30
    d.roll()
    assert (d.yesterday_morning, d.today_morning) == (9, 30)


def test_rocketmqs_number_formats() -> None:
    assert [human_bytes(n) for n in (512, 1536, 5 << 30)] == ["512 B", "1.5 KiB", "5.0 GiB"]
    assert runtime_text(((2 * 24 + 3) * 3600 + 4 * 60 + 5) * 1000 + 999) == "[ 2 days, 3 hours, 4 minutes, 5 seconds ]"


def test_pull_requests_found_and_missed_give_rocketmqs_get_tps_keys(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """getFoundTps, getMissTps and getTotalTps (rocketmq-dashboard reads getTotalTps) from the
    pull requests that handed messages and those that did not."""
    from quarry.services.commitlog.broker import runtime_info
    from quarry.services.commitlog.storage.store import CommitLogStore, StoreConfig

    store = CommitLogStore(StoreConfig(store_dir=tmp_path / "s", segment_size=4096))
    found, missed, now = [0], [0], [0.0]
    try:
        info = runtime_info.RuntimeInfo(store, lambda: 0, lambda: 0, found_total=lambda: found[0], missed_total=lambda: missed[0])
        for s in (info.found, info.missed):
            s._clock = lambda: now[0]
        for _ in range(11):  # 10 s of samples: 3 found and 1 missed pull a second
            info.sample()
            now[0] += 1.0
            found[0] += 3
            missed[0] += 1
        table = info.table()
        assert table["getFoundTps"].split()[0] == "3.00" and table["getMissTps"].split()[0] == "1.00"
        assert table["getTotalTps"].split() == ["4.00", "0.00", "0.00"]
    finally:
        store.close()
