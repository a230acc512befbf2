"""Resolved halves are remembered once each, and forgotten once retention deleted them."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from quarry.services.commitlog.broker.transactions import OP_TOPIC, AlreadyResolved, Transactions


def test_resolved_halves_below_the_logs_start_are_forgotten_and_the_rest_still_refused() -> None:
    store = SimpleNamespace(topics={OP_TOPIC: 0}, min_offset=0)
    tx = Transactions(store)  # type: ignore[arg-type]
    half = lambda offset: SimpleNamespace(physical_offset=offset)  # noqa: E731
    for offset in range(0, 4096 * 100, 100):  # 4,096 halves, every one resolved once
        tx.claim(half(offset))  # type: ignore[arg-type]
    with pytest.raises(AlreadyResolved):
        tx.claim(half(4096 * 100 - 100))  # type: ignore[arg-type]
    store.min_offset = 4096 * 100  # retention deleted every segment holding them
    for offset in range(4096 * 100, 4096 * 200 + 100, 100):  # the next 4,097 reach the prune
        tx.claim(half(offset))  # type: ignore[arg-type]
    assert not tx.is_resolved(half(0)) and not tx.is_resolved(half(4096 * 100 - 100))  # type: ignore[arg-type]
    assert tx.is_resolved(half(4096 * 100))  # type: ignore[arg-type]
    with pytest.raises(AlreadyResolved):  # what the log still holds stays refused
        tx.claim(half(4096 * 150))  # type: ignore[arg-type]
