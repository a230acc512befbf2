"""Merge: collision filtering, newest-first order, de-duplication, pages that cover every match once."""
from __future__ import annotations

import pytest

from quarry.v1 import common_pb2
from services.query.merge import BadTokenError, decode_token, encode_token, merge_key_answers, merge_unique_key_answers, query_digest


def _msg(broker: str, offset: int, ts: int, topic: str = "T", keys: tuple[str, ...] = ("k",), uniq: str = "") -> common_pb2.StoredMessage:
    return common_pb2.StoredMessage(broker_name=broker, commit_log_offset=offset, store_timestamp=ts, topic=topic, keys=list(keys), unique_key=uniq)


def test_equal_hash_keys_and_other_topics_are_filtered() -> None:
    answers = [_msg("a", 1, 10, keys=("Aa",)), _msg("a", 2, 11, keys=("BB",)), _msg("b", 3, 12, topic="U", keys=("Aa",)), _msg("b", 4, 9, keys=("x", "Aa"))]
    page = merge_key_answers(answers, "T", "Aa", 64, None, "d")
    assert [(m.broker_name, m.commit_log_offset) for m in page.messages] == [("a", 1), ("b", 4)]
    assert page.collisions == 2
    assert page.next_token is None


def test_key_is_matched_exactly_not_as_substring() -> None:
    page = merge_key_answers([_msg("a", 1, 10, keys=("order-10",))], "T", "order-1", 64, None, "d")
    assert page.messages == [] and page.collisions == 1


def test_same_record_returned_twice_is_kept_once() -> None:
    page = merge_key_answers([_msg("a", 1, 10), _msg("a", 1, 10), _msg("b", 1, 10)], "T", "k", 64, None, "d")
    assert len(page.messages) == 2


def test_pages_return_every_match_exactly_once() -> None:
    all_msgs = [_msg(b, off, 1000 + (off * 7 + ord(b)) % 13) for b in "abc" for off in range(20)]
    digest = query_digest("T", "k", 0, 99)
    seen = []
    token = None
    for _ in range(100):
        # Each broker answers as the index would: matches at or before the token's time.
        pool = [m for m in all_msgs if token is None or m.store_timestamp <= token.store_timestamp]
        page = merge_key_answers(pool, "T", "k", 7, token, digest)
        seen += [(m.broker_name, m.commit_log_offset) for m in page.messages]
        if page.next_token is None:
            break
        token = decode_token(encode_token(page.next_token), digest)
    assert sorted(seen) == sorted((m.broker_name, m.commit_log_offset) for m in all_msgs)
    assert len(seen) == len(set(seen))


def test_token_from_another_query_is_rejected() -> None:
    page = merge_key_answers([_msg("a", i, i) for i in range(5)], "T", "k", 2, None, query_digest("T", "k", 0, 9))
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
