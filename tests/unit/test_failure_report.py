"""A repeating background step reports a failure once when it starts and once when it ends."""
from __future__ import annotations

import logging

import pytest

from quarry.services.log import FailureReport


def test_failure_is_logged_once_and_recovery_once(caplog: pytest.LogCaptureFixture) -> None:
    report = FailureReport(logging.getLogger("quarry.test.rounds"), "step failed", "step recovered")
    outcomes = iter([OSError("disk"), OSError("disk again"), None, None, ValueError("bad")])

    def step() -> None:
        exc = next(outcomes)
        if exc is not None:
            raise exc

    with caplog.at_level(logging.INFO, logger="quarry.test.rounds"):
        results = [report.run(step) for _ in range(2)]
        assert report.failing == "OSError('disk again')"
        results += [report.run(step) for _ in range(3)]
    assert results == [False, False, True, True, False]
    assert [r.getMessage() for r in caplog.records] == ["step failed", "step recovered", "step failed"]
    assert caplog.records[0].levelno == logging.ERROR and caplog.records[0].kv == {"error": "OSError('disk')"}  # type: ignore[attr-defined]
    assert caplog.records[1].kv == {"previous_error": "OSError('disk again')"}  # type: ignore[attr-defined]
    assert report.failing == "ValueError('bad')"
