"""Flags that fall back to environment variables, so every setting works in a container.

Each option is `--flag` on the command line, else `$ENV_NAME`, else the default; `--help`
shows all three.
"""
from __future__ import annotations

import argparse
import os
from typing import Any, Callable


class EnvArgumentParser(argparse.ArgumentParser):
    """argparse with `add_setting(flag, env, default, help, type)`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.ArgumentDefaultsHelpFormatter)
        super().__init__(*args, **kwargs)
        self.env_names: dict[str, str] = {}
        self.minimums: dict[str, tuple[str, float]] = {}  # dest -> (flag, smallest allowed value)

    def add_setting(
        self,
        flag: str,
        env: str,
        default: Any,
        help: str,
        type: Callable[[str], Any] = str,
        choices: list[str] | None = None,
        minimum: float | None = None,
    ) -> None:
        """`minimum`: values below it (from the flag or the environment) are refused at start."""
        raw = os.environ.get(env)
        if raw is not None and raw != "":
            try:
                value = type(raw)
            except ValueError as exc:
                self.error(f"environment variable {env}={raw!r}: {exc}")
        else:
            value = default
        dest = flag.lstrip("-").replace("-", "_")
        self.env_names[dest] = env
        if minimum is not None:
            self.minimums[dest] = (flag, minimum)
        self.add_argument(flag, dest=dest, default=value, type=type, choices=choices, help=f"{help} [env {env}]")


    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:  # type: ignore[override]
        parsed, rest = super().parse_known_args(args, namespace)
        for dest, (flag, minimum) in self.minimums.items():
            value = getattr(parsed, dest, None)
            if value is not None and value < minimum:
                self.error(f"{flag} [env {self.env_names[dest]}]: must be >= {minimum:g}, got {value}")
        return parsed, rest


def parse_bool(text: str) -> bool:
    """'true/1/yes/on' → True, 'false/0/no/off' → False; anything else is an error."""
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")
