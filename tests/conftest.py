"""Shared fixtures and hooks: golden-vector cases are discovered while collecting (tests/vectors.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.vectors import REPO_ROOT, fail_unavailable, generate, golden_root, require_root

__all__ = ["REPO_ROOT", "golden_root"]


LANES = ("unit", "contract", "e2e")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "golden_cases(argnames, discover): parametrize from the golden vectors at collection time")
    for lane in LANES:
        config.addinivalue_line("markers", f"{lane}: a test under tests/{lane}/ (marked by its folder; `make check` is unit and contract)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Each test carries its folder's lane, so `pytest -m "unit or contract"` selects the fast lane
    # from any set of paths.
    for item in items:
        parts = item.path.relative_to(REPO_ROOT).parts
        if len(parts) > 1 and parts[0] == "tests" and parts[1] in LANES:
            item.add_marker(parts[1])


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    generate(metafunc)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> None:
    fail_unavailable(pyfuncitem.funcargs)


@pytest.fixture(scope="session")
def golden_dir() -> Path:
    """The golden root; a test that uses it fails (naming the path) when it is missing or empty."""
    return require_root()
