"""A team's code location outside the repository, driven as a user drives it: the team's package
written to a temporary folder (which nothing in the repository can import), a workspace file
naming it, an empty DAGSTER_HOME, and ``python -m pipelines`` run as a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class TeamLocation:
    workspace: Path
    home: Path  # DAGSTER_HOME
    cwd: Path
    env: dict[str, str]

    def cli(self, *args: str) -> str:
        """``python -m pipelines <args> --workspace <the team's>``; its stdout and stderr (it must succeed)."""
        proc = subprocess.run([sys.executable, "-m", "pipelines", *args, "--workspace", str(self.workspace)],
                              cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
        return proc.stdout + proc.stderr

    def store(self):
        from pipelines.profiles import Profile

        return Profile(name="local", data_root=self.home / "platform").store()


def team_location(tmp_path: Path, package: str, definitions: str) -> TeamLocation:
    """``package``'s ``definitions.py`` (defining ``defs``) as a code location of its own."""
    team_root = tmp_path / "team-code"
    (team_root / package).mkdir(parents=True)
    (team_root / package / "__init__.py").touch()
    (team_root / package / "definitions.py").write_text(definitions)
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text(f"load_from:\n  - python_module:\n      module_name: {package}.definitions\n"
                         f"      attribute: defs\n      location_name: {package}\n"
                         f"      working_directory: {team_root}\n")
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "PLATFORM_PROFILE", "PYTHONPATH")}
    env.update(DAGSTER_HOME=str(home), PYTHONPATH=str(REPO))
    return TeamLocation(workspace=workspace, home=home, cwd=tmp_path, env=env)
