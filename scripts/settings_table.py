"""docs/settings.md's table, made from the services' own flag parsers so it cannot drift.

`python -m scripts.settings_table` prints the table; `--write` puts it into docs/settings.md
between the markers; a contract test checks the file holds exactly what this makes.
"""
from __future__ import annotations

import argparse
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

BEGIN = "<!-- settings:begin -->"
END = "<!-- settings:end -->"
README = Path(__file__).resolve().parent.parent / "README.md"
SETTINGS = Path(__file__).resolve().parent.parent / "docs" / "settings.md"


def _parsers() -> list[tuple[str, Callable[[], Any]]]:
    from quarry.services.commitlog.config import build_parser as commitlog
    from quarry.services.indexer.config import build_parser as indexer
    from quarry.services.query.config import build_parser as router
    from quarry.clients.console.config import build_parser as console

    return [("commitlog", commitlog), ("indexer", indexer), ("router", router), ("console", console)]


@contextmanager
def _clean_environment() -> Iterator[None]:
    """Defaults as shipped: a QUARRY_* variable of this shell must not become a 'default'."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("QUARRY_")}
    for k in saved:
        del os.environ[k]
    try:
        yield
    finally:
        os.environ.update(saved)


def _default(value: Any, dest: str) -> str:
    if value is None or value == "":
        return "(none)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def rows() -> list[tuple[str, str, str, str, str]]:
    """(service, flag, env, default, meaning) for every setting of every service."""
    out = []
    with _clean_environment():
        for service, build in _parsers():
            parser = build()
            env_names: dict[str, str] = getattr(parser, "env_names", {})
            for action in parser._actions:  # argparse keeps no public list of options
                if not action.option_strings or isinstance(action, argparse._HelpAction):
                    continue
                flag = max(action.option_strings, key=len)
                env = env_names.get(action.dest, "")
                meaning = (action.help or "").split(" [env ")[0].replace("%%", "%").replace("|", "\\|")  # argparse help escapes % as %%
                if action.choices:
                    meaning += f" (one of {', '.join(map(str, action.choices))})"
                out.append((service, f"`{flag}`", f"`{env}`" if env else "", _default(action.default, action.dest), meaning))
    return out


def table() -> str:
    lines = ["| service | flag | environment variable | default | meaning |", "|---|---|---|---|---|"]
    lines += [f"| {s} | {f} | {e} | {d} | {m} |" for s, f, e, d, m in rows()]
    return "\n".join(lines)


def section() -> str:
    return f"{BEGIN}\n{table()}\n{END}"


def readme_section(text: str) -> str:
    """The marked section of README text ('' when the markers are missing)."""
    if BEGIN not in text or END not in text:
        return ""
    start = text.index(BEGIN)
    return text[start:text.index(END, start) + len(END)]


def write(path: Path = SETTINGS) -> bool:
    """Replace the marked section; True when the file changed."""
    text = path.read_text()
    old = readme_section(text)
    if not old:
        raise SystemExit(f"{path}: markers {BEGIN!r} … {END!r} not found")
    new = text.replace(old, section())
    if new != text:
        path.write_text(new)
    return new != text


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--write"]:
        print("docs/settings.md updated" if write() else "docs/settings.md already up to date")
    else:
        print(table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
