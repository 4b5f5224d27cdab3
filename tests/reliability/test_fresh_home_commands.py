"""README's first documented commands in README's order on an empty DAGSTER_HOME, from ``make
demo`` on, each in a fresh process with nothing prepared (the list: tests/user_paths/readme_commands.py;
``make test`` runs those that do not train, tests/user_paths/test_fresh_home.py). Minutes of
training on two cores, so only ``make reliability`` runs it."""

from __future__ import annotations

import pytest

from tests.user_paths.readme_commands import COMMANDS, check_documented, run_documented


@pytest.mark.heavy
def test_readmes_commands_in_order_on_an_empty_home(tmp_path, ledger):
    home = tmp_path / "dagster-home"
    home.mkdir()
    done = 0
    try:
        for command in COMMANDS:
            check_documented(command, run_documented(command, home, timeout=1800), command.after_demo)
            done += 1
    finally:
        ledger.record("user path: README's commands on an empty DAGSTER_HOME", done == len(COMMANDS), True,
                      f"{done} of {len(COMMANDS)} commands as documented, from make demo on")
