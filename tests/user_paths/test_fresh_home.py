"""README's first documented commands (tests/user_paths/readme_commands.py) on an empty
DAGSTER_HOME, each in a fresh process as typed from the repository root, nothing prepared: no
dagster.yaml, no sources, no PYTHONPATH. Each command that does not train runs as it behaves on
the empty home alone: it works, or fails naming the command to run. The whole list in README's
order, from ``make demo`` on (minutes of training), is tests/reliability/test_fresh_home_commands.py.
"""

from __future__ import annotations

import pytest

from tests.user_paths.readme_commands import COMMANDS, check_documented, run_documented

pytestmark = pytest.mark.slow


def test_on_an_empty_home_each_command_works_or_names_the_command_to_run(tmp_path):
    home = tmp_path / "dagster-home"
    home.mkdir()
    ran = []
    for command in COMMANDS:
        if command.alone is None:
            continue  # make demo and the wine job: the full run
        check_documented(command, run_documented(command, home, timeout=300), command.alone)
        ran.append(command.argv)
    assert len(ran) == len([c for c in COMMANDS if c.alone is not None]) >= 5
    # The example data is where the pages say, for the next job to read.
    assert (home / "platform" / "sources" / "digits" / "digits.csv").is_file()
