"""ReplayGuard: a signature is accepted once while its timestamp is in the window, and forgotten after."""
from __future__ import annotations

from quarry.services.replay_guard import BUCKET_MS, ReplayGuard


def test_a_signature_is_accepted_once_and_forgotten_when_its_window_has_passed() -> None:
    now = [1_000_000_000]
    guard = ReplayGuard(window_ms=300_000, clock_ms=lambda: now[0])
    assert guard.first_use("ab" * 32, now[0])
    assert not guard.first_use("ab" * 32, now[0])
    assert guard.first_use("cd" * 32, now[0])  # another signature, same millisecond
    assert len(guard) == 2
    now[0] += 300_000  # the timestamp is still acceptable (exactly at the edge): still remembered
    assert not guard.first_use("ab" * 32, now[0] - 300_000)
    now[0] += BUCKET_MS + 1  # now the timestamp is refused as stale anyway: memory is released
    assert guard.first_use("ef" * 32, now[0])
    assert len(guard) == 1


def test_a_future_timestamp_is_remembered_until_it_too_has_passed() -> None:
    now = [5_000_000]
    guard = ReplayGuard(window_ms=60_000, clock_ms=lambda: now[0])
    future = now[0] + 60_000
    assert guard.first_use("01" * 32, future)
    now[0] += 110_000
    assert not guard.first_use("01" * 32, future)
