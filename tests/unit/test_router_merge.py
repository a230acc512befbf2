"""Merge: collision filtering, exact store-time windows, newest-first order, de-duplication,
pages that cover every match once and are full whatever the collisions."""
from __future__ import annotations

import pytest

from quarry.v1 import common_pb2
from quarry.services.query.merge import (
    BadTokenError, decode_token, encode_token, key_matches, merge_key_answers, order_copies, query_digest, unique_key_matches,
)


def _msg(broker: str, offset: int, ts: int, topic: str = "T", keys: tuple[str, ...] = ("k",), uniq: str = "") -> common_pb2.StoredMessage:
    return common_pb2.StoredMessage(broker_name=broker, commit_log_offset=offset, store_timestamp=ts, topic=topic, keys=list(keys), unique_key=uniq)


def test_equal_hash_keys_and_other_topics_do_not_match() -> None:
    msgs = [_msg("a", 1, 10, keys=("Aa",)), _msg("a", 2, 11, keys=("BB",)), _msg("b", 3, 12, topic="U", keys=("Aa",)), _msg("b", 4, 9, keys=("x", "Aa"))]
    assert [(m.broker_name, m.commit_log_offset) for m in msgs if key_matches(m, "T", "Aa")] == [("a", 1), ("b", 4)]


def test_key_is_matched_exactly_not_as_substring() -> None:
    assert not key_matches(_msg("a", 1, 10, keys=("order-10",)), "T", "order-1")


def test_store_time_window_is_exact_to_the_millisecond() -> None:
    m = _msg("a", 1, 1_700_000_000_500)
    assert key_matches(m, "T", "k", 1_700_000_000_500, 1_700_000_000_500)
    assert not key_matches(m, "T", "k", 1_700_000_000_501, 1_700_000_001_000)
    assert not key_matches(m, "T", "k", 1_700_000_000_000, 1_700_000_000_499)
    assert unique_key_matches(_msg("a", 1, 5, uniq="U"), "T", "U", 5, 5) and not unique_key_matches(_msg("a", 1, 5, uniq="U"), "T", "U", 6, 9)


def test_same_record_returned_twice_is_kept_once() -> None:
    page = merge_key_answers({"a": [_msg("a", 1, 10), _msg("a", 1, 10)], "b": [_msg("b", 1, 10)]}, {"a": 0, "b": 0}, 64, None, "d")
    # a's record once, and b's record at the same offset kept: another broker, another message.
    assert sorted((m.broker_name, m.commit_log_offset) for m in page.messages) == [("a", 1), ("b", 1)] and page.next_token is None


def _scan(entries: list[common_pb2.StoredMessage], below: int, cap: int, want: int) -> tuple[list[common_pb2.StoredMessage], int]:
    """What the router reads of one broker: index batches of `cap` below the bound (newest
    first, collisions included) until `want` match or the index has no more."""
    matched: list[common_pb2.StoredMessage] = []
    while True:
        batch = sorted((m for m in entries if below <= 0 or m.commit_log_offset < below), key=lambda m: -m.commit_log_offset)[:cap]
        matched += [m for m in batch if key_matches(m, "T", "k")]
        more = min(m.commit_log_offset for m in batch) if len(batch) >= cap else 0
        if not more or len(matched) >= want:
            return matched, more
        below = more


@pytest.mark.parametrize("cap", [3, 7, 64])
def test_pages_are_full_and_return_every_match_exactly_once_with_collisions(cap: int) -> None:
    # Every message in the same second, plus collisions interleaved: the hard case for paging.
    brokers = {b: [_msg(b, off, 1000 + off // 4, keys=("k",) if off % 3 else ("other",)) for off in range(1, 40)] for b in "abc"}
    want = {(m.broker_name, m.commit_log_offset) for ms in brokers.values() for m in ms if "k" in m.keys}
    digest = query_digest("T", "k", 0, 99)
    seen: list[tuple[str, int]] = []
    sizes: list[int] = []
    token = None
    for _ in range(200):
        scans = {b: _scan(ms, token.bounds.get(b, 0) if token else 0, cap, 5) for b, ms in brokers.items() if not token or token.bounds.get(b, 0) != -1}
        page = merge_key_answers({b: s[0] for b, s in scans.items()}, {b: s[1] for b, s in scans.items()}, 5, token, digest)
        seen += [(m.broker_name, m.commit_log_offset) for m in page.messages]
        sizes.append(len(page.messages))
        if page.next_token is None:
            break
        token = decode_token(encode_token(page.next_token), digest)
    assert len(seen) == len(set(seen))
    assert set(seen) == want
    assert all(n == 5 for n in sizes[:-1]) and 0 < sizes[-1] <= 5  # full pages while matches remain


def test_token_from_another_query_is_rejected() -> None:
    page = merge_key_answers({"a": [_msg("a", i, i) for i in range(1, 6)]}, {"a": 0}, 2, None, query_digest("T", "k", 0, 9))
    assert page.next_token is not None
    text = encode_token(page.next_token)
    with pytest.raises(BadTokenError, match="another topic"):
        decode_token(text, query_digest("T", "other", 0, 9))
    with pytest.raises(BadTokenError, match="continuation_token"):
        decode_token("!!not-a-token", "x")


def test_unique_key_copies_earliest_first() -> None:
    copies = order_copies([_msg("b", 5, 30, uniq="U1"), _msg("a", 9, 20, uniq="U1"), _msg("a", 9, 20, uniq="U1")])
    assert [(m.broker_name, m.store_timestamp) for m in copies] == [("a", 20), ("b", 30)]
