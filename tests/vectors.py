"""The golden vectors: where they are, how tests read them, and how cases are discovered.

Nothing here touches a file at import time. Test modules declare their cases with
`@golden_cases("argnames", discover)`; `discover(root)` runs while pytest collects (the hook is
`pytest_generate_tests` in tests/conftest.py) and returns `pytest.param`s. When the vectors are
missing, unreadable or yield no case, the test gets one case that FAILS and names the path, so a
wrong `$QUARRY_GOLDEN` can never pass by running nothing.

Another set of vectors with the same layout (tests/golden/README.md) runs unchanged: point
`$QUARRY_GOLDEN` at it.
"""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
COMMITTED = REPO_ROOT / "tests" / "golden"

Discover = Callable[[Path], Iterable[Any]]


class GoldenMissing(pytest.fail.Exception):  # type: ignore[misc,name-defined]
    """Vectors absent or unreadable. A pytest failure: raised in a test body it fails that test."""

    def __init__(self, message: str) -> None:
        super().__init__(message, pytrace=False)
        self.message = message


class Unavailable:
    """Stands in for every argument of a case that could not be discovered; the test fails with `reason`."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"Unavailable({self.reason!r})"


def golden_root() -> Path:
    """The RocketMQ 4.9.8 golden vectors: $QUARRY_GOLDEN, else tests/golden."""
    env = os.environ.get("QUARRY_GOLDEN")
    return Path(env) if env else COMMITTED


def where() -> str:
    source = "$QUARRY_GOLDEN" if os.environ.get("QUARRY_GOLDEN") else "the default"
    return f"{golden_root()} ({source})"


def require_root() -> Path:
    root = golden_root()
    if not root.is_dir():
        raise GoldenMissing(f"golden vectors not found: {where()} is not a directory")
    if not any(root.iterdir()):
        raise GoldenMissing(f"golden vectors not found: {where()} is empty")
    return root


@functools.lru_cache(maxsize=None)
def _read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def load_json(relative: str | Path) -> Any:
    """A JSON vector file under the golden root (cached: many tests read the same file)."""
    path = require_root() / relative
    if not path.is_file():
        raise GoldenMissing(f"golden vector file {path} is missing (vectors at {where()})")
    try:
        return _read_json(path)
    except (OSError, ValueError) as e:
        raise GoldenMissing(f"golden vector file {path} is unreadable: {e}") from None


def glob(pattern: str) -> list[Path]:
    """Files under the golden root matching `pattern`, sorted; none is a failure naming the pattern."""
    root = require_root()
    found = sorted(root.glob(pattern))
    if not found:
        raise GoldenMissing(f"no golden vectors match {root / pattern} (vectors at {where()})")
    return found


def golden_cases(argnames: str, discover: Discover) -> pytest.MarkDecorator:
    """Parametrize `argnames` with the cases `discover(golden_root)` finds at collection time."""
    return pytest.mark.golden_cases(argnames, discover)


def generate(metafunc: pytest.Metafunc) -> None:
    """The pytest_generate_tests hook's body: turn each golden_cases mark into parameters."""
    for mark in metafunc.definition.iter_markers("golden_cases"):
        argnames, discover = mark.args
        names = [n.strip() for n in argnames.split(",")]
        try:
            params = list(discover(require_root()))
            if not params:
                raise GoldenMissing(f"the golden vectors at {where()} hold no case for {metafunc.function.__name__}")
        except GoldenMissing as e:
            params = [_failing_case(e.message, len(names))]
        except (OSError, ValueError, KeyError, TypeError) as e:
            params = [_failing_case(f"golden vectors at {where()} do not have the documented layout: {type(e).__name__}: {e}", len(names))]
        metafunc.parametrize(argnames, params)


def _failing_case(reason: str, arity: int) -> Any:
    values = [Unavailable(reason)] * arity
    return pytest.param(*values, id="golden-vectors-unavailable")


def fail_unavailable(funcargs: dict[str, Any]) -> None:
    """Called before a test runs: a case standing for missing vectors fails with their reason."""
    for value in funcargs.values():
        if isinstance(value, Unavailable):
            pytest.fail(value.reason, pytrace=False)
