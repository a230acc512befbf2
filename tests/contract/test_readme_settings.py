"""docs/settings.md's table is exactly what the services' own flag parsers make (issue 15
item 24): a flag added, renamed or given a new default without the table fails here."""
from __future__ import annotations

from scripts import settings_table


def test_the_settings_table_matches_the_services_flags() -> None:
    text = settings_table.SETTINGS.read_text()
    assert settings_table.readme_section(text) == settings_table.section(), "run: python -m scripts.settings_table --write"


def test_every_flag_of_every_service_is_in_the_table() -> None:
    from quarry.services.query.config import build_parser

    rows = settings_table.rows()
    router_flags = {flag for service, flag, *_ in rows if service == "router"}
    for action in build_parser()._actions:
        if action.option_strings and "--help" not in action.option_strings:
            assert f"`{max(action.option_strings, key=len)}`" in router_flags
    assert all(env for _, _, env, _, _ in rows), "every setting has its environment variable"


def test_readme_says_how_to_run_quarry_and_the_python_example() -> None:
    text = settings_table.README.read_text()
    assert ".venv/bin/quarry" in text and ".venv/bin/python" in text and "Ctrl-C" in text
