"""Merge: collision filtering, newest-first order, de-duplication, pages that cover every match once."""
from __future__ import annotations

import pytest

from quarry.v1 import common_pb2
from quarry.services.query.merge import BadTokenError, decode_token, encode_token, merge_key_answers, merge_unique_key_answers, query_digest


def _msg(broker: str, offset: int, ts: int, topic: str = "T", keys: tuple[str, ...] = ("k",), uniq: str = "") -> common_pb2.StoredMessage:
    return common_pb2.StoredMessage(broker_name=broker, commit_log_offset=offset, store_timestamp=ts, topic=topic, keys=list(keys), unique_key=uniq)


def test_equal_hash_keys_and_other_topics_are_filtered() -> None:
    answers = {"a": [_msg("a", 1, 10, keys=("Aa",)), _msg("a", 2, 11, keys=("BB",))], "b": [_msg("b", 3, 12, topic="U", keys=("Aa",)), _msg("b", 4, 9, keys=("x", "Aa"))]}
    page = merge_key_answers(answers, "T", "Aa", 64, None, "d", fetch_cap=64)
    assert [(m.broker_name, m.commit_log_offset) for m in page.messages] == [("a", 1), ("b", 4)]
    assert page.collisions == 2
    assert page.next_token is None


def test_key_is_matched_exactly_not_as_substring() -> None:
    page = merge_key_answers({"a": [_msg("a", 1, 10, keys=("order-10",))]}, "T", "order-1", 64, None, "d", fetch_cap=64)
    assert page.messages == [] and page.collisions == 1


def test_same_record_returned_twice_is_kept_once() -> None:
    page = merge_key_answers({"a": [_msg("a", 1, 10), _msg("a", 1, 10)], "b": [_msg("b", 1, 10)]}, "T", "k", 64, None, "d", fetch_cap=64)
    # a's record once, and b's record at the same offset kept: another broker, another message.
    assert sorted((m.broker_name, m.commit_log_offset) for m in page.messages) == [("a", 1), ("b", 1)]


def _index_answer(entries: list[common_pb2.StoredMessage], below: int, cap: int) -> list[common_pb2.StoredMessage]:
    """What one broker's index returns: newest entries below the bound, at most cap."""
    return sorted((m for m in entries if below <= 0 or m.commit_log_offset < below), key=lambda m: -m.commit_log_offset)[:cap]


@pytest.mark.parametrize("cap", [3, 7, 64])
def test_pages_return_every_match_exactly_once_even_within_one_second_and_with_collisions(cap: int) -> None:
    # Every message in the same second, plus collisions interleaved: the hard case for paging.
    brokers = {b: [_msg(b, off, 1000 + off // 4, keys=("k",) if off % 3 else ("other",)) for off in range(1, 40)] for b in "abc"}
    want = {(m.broker_name, m.commit_log_offset) for ms in brokers.values() for m in ms if "k" in m.keys}
    digest = query_digest("T", "k", 0, 99)
    seen: list[tuple[str, int]] = []
    token = None
    for _ in range(200):
        answers = {b: _index_answer(ms, token.bounds.get(b, 0) if token else 0, cap) for b, ms in brokers.items() if not token or token.bounds.get(b, 0) != -1}
        page = merge_key_answers(answers, "T", "k", 5, token, digest, fetch_cap=cap)
        seen += [(m.broker_name, m.commit_log_offset) for m in page.messages]
        if page.next_token is None:
            break
        token = decode_token(encode_token(page.next_token), digest)
    assert len(seen) == len(set(seen))
    assert set(seen) == want


def test_token_from_another_query_is_rejected() -> None:
    page = merge_key_answers({"a": [_msg("a", i, i) for i in range(1, 6)]}, "T", "k", 2, None, query_digest("T", "k", 0, 9), fetch_cap=64)
    assert page.next_token is not None
    text = encode_token(page.next_token)
    with pytest.raises(BadTokenError, match="another topic"):
        decode_token(text, query_digest("T", "other", 0, 9))
    with pytest.raises(BadTokenError, match="continuation_token"):
        decode_token("!!not-a-token", "x")


def test_unique_key_copies_earliest_first() -> None:
    copies, collisions = merge_unique_key_answers([_msg("b", 5, 30, uniq="U1"), _msg("a", 9, 20, uniq="U1"), _msg("a", 3, 10, uniq="U2")], "T", "U1")
    assert [(m.broker_name, m.store_timestamp) for m in copies] == [("a", 20), ("b", 30)]
    assert collisions == 1
