"""A browse page with a broker that does not answer (killed): the live brokers' rows are on the
page, in order, never an empty page while a live broker has rows; the silent broker keeps its
place in the token, so when it is back the browse brings its rows, each message once. Two real
stores stand in for two brokers' commitlogs (the fixture of test_router_browse_pages)."""
from __future__ import annotations

import pytest

from quarry.services.commitlog.storage.store import CommitLogStore
from quarry.services.query.browse_pages import BrokerPlace, BrowseToken, decode_token, encode_token, merge_page
from tests.unit.test_router_browse_pages import _answer, stores  # noqa: F401 (stores: the fixture)

Stores = tuple[dict[str, CommitLogStore], list[tuple[int, str, int]]]
END = 2**62


def _page(brokers: dict[str, CommitLogStore], token: BrowseToken, live: set[str], oldest_first: bool, max_num: int, tags: str = ""):  # type: ignore[no-untyped-def]
    answers = {n: _answer(s, n, token.brokers[n], 0, END, tags, oldest_first, max_num) for n, s in brokers.items()
               if n in live and not token.brokers[n].finished}
    page = merge_page(answers, token, max_num, oldest_first)
    return page, decode_token(encode_token(page.token), "d")


@pytest.mark.parametrize("oldest_first", [True, False])
@pytest.mark.parametrize("killed_at_page", [0, 1, 4])
@pytest.mark.parametrize("max_num", [7, 64])
def test_a_killed_broker_never_empties_a_page_while_a_live_one_has_rows(stores: Stores, oldest_first: bool, killed_at_page: int, max_num: int) -> None:  # noqa: F811 (stores: the imported fixture)
    brokers, sent = stores
    order = {f"m{i}".encode(): (t, n) for t, n, i in sent}
    token = BrowseToken("d", END, {n: BrokerPlace() for n in brokers})
    seen: list[bytes] = []
    for _ in range(killed_at_page):
        page, token = _page(brokers, token, set(brokers), oldest_first, max_num)
        seen += [m.body for m in page.messages]
    b_place = token.brokers["broker-b"]
    a_rows = [b for b in sorted(order, key=lambda b: order[b][0], reverse=not oldest_first) if order[b][1] == "broker-a" and b not in seen]
    assert a_rows, "the live broker has rows left"
    alone: list[bytes] = []
    while True:  # broker-b killed: every page holds broker-a's next rows, none empty
        page, token = _page(brokers, token, {"broker-a"}, oldest_first, max_num)
        if token.brokers["broker-a"].finished and not page.messages:
            break
        assert page.messages, "an empty page although broker-a has rows"
        assert {m.broker_name for m in page.messages} == {"broker-a"}
        times = [m.store_timestamp for m in page.messages]
        assert times == sorted(times, reverse=not oldest_first)
        assert page.more  # broker-b has not finished: more follow (once it is back)
        assert token.brokers["broker-b"] == b_place  # its place kept for when it answers again
        alone += [m.body for m in page.messages]
        if token.brokers["broker-a"].finished:
            break
    assert sorted(alone) == sorted(a_rows) and [order[b][0] for b in alone] == [order[b][0] for b in a_rows]
    rest: list[bytes] = []
    while True:  # broker-b back: the browse goes on from its place
        page, token = _page(brokers, token, set(brokers), oldest_first, max_num)
        rest += [m.body for m in page.messages]
        if not page.more:
            break
    everything = seen + alone + rest
    assert sorted(everything) == sorted(order) and len(set(everything)) == len(everything)
