"""Shared fixtures and hooks: golden-vector cases are discovered while collecting (tests/vectors.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.vectors import REPO_ROOT, fail_unavailable, generate, golden_root, require_root

__all__ = ["REPO_ROOT", "golden_root"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "golden_cases(argnames, discover): parametrize from the golden vectors at collection time")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    generate(metafunc)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> None:
    fail_unavailable(pyfuncitem.funcargs)


@pytest.fixture(scope="session")
def golden_dir() -> Path:
    """The golden root; a test that uses it fails (naming the path) when it is missing or empty."""
    return require_root()
