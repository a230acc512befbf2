"""Every installed command and every sub-command answers --help (a help string argparse cannot
format, such as a bare '%', breaks only --help and so goes unseen by the tests that run services).
In process, over the parsers themselves; tests/e2e/test_install.py checks the installed scripts."""
from __future__ import annotations

import argparse
import importlib
import tomllib
from pathlib import Path
from typing import Any, Callable

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS: dict[str, str] = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
# Reached through the container entry point rather than a console script.
ENTRY_POINTS = {**SCRIPTS, "quarry-probe": "quarry.services.probe:main"}


def _main(target: str) -> Callable[[list[str]], Any]:
    module, func = target.split(":")
    return getattr(importlib.import_module(module), func)  # type: ignore[no-any-return]


def _subcommands(target: str) -> list[str]:
    build = getattr(importlib.import_module(target.split(":")[0]), "build_parser", None)
    if build is None:
        return []
    return [name for action in build()._actions if isinstance(action, argparse._SubParsersAction) for name in action.choices]


CASES = [(name, sub) for name, target in sorted(ENTRY_POINTS.items()) for sub in [None, *_subcommands(target)]]


def test_the_commands_with_sub_commands_are_found() -> None:
    assert {name for name, sub in CASES if sub} >= {"quarry", "quarry-pipeline"}


@pytest.mark.parametrize(("name", "sub"), CASES, ids=[f"{n} {s or ''}".strip() for n, s in CASES])
def test_help_prints_usage_and_exits_0(name: str, sub: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    try:  # argparse exits; the quarry CLI turns that exit into its return code
        code = _main(ENTRY_POINTS[name])([*([sub] if sub else []), "--help"])
    except SystemExit as done:
        code = done.code
    out = capsys.readouterr()
    assert code == 0, out.err
    assert out.out.startswith("usage:") and "%(" not in out.out, out.out
