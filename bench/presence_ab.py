"""Key presence, A/B in one run: one cluster of three brokers, two routers over it, one asking
a key or unique-key query only of the brokers whose key presence filter may hold the key
(`--key-presence on`, the default), the other asking every broker holding the topic (`off`);
rounds interleaved, CPU per query of the router and the brokers beside each rate (see
bench/router_ab.py, which this runs with other variants).

`.venv/bin/python -m bench presence_ab [--messages N] [--queries N] [--cycles N]`
"""
from __future__ import annotations

from bench.router_ab import run_ab
from bench.runner import Result

KEY_PRESENCE = {"on": ["--key-presence", "on"], "off": ["--key-presence", "off"]}


def run(argv: list[str]) -> list[Result]:
    return run_ab(argv, "presence_ab", KEY_PRESENCE, "key_presence", ("by key", "by unique key", "mixed"))
