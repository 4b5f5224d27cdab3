"""The two user paths the matrix runs, and the commands a user types for each, run as a user runs them.

- ``platform``: the wine pipeline in a location of the platform's own kind inside the repository
  (tests/user_paths/platform_location.py): the built-in trainer, task and model.
- ``team``: the cellar team's location in a temporary folder outside the repository
  (tests/user_paths/team_package, copied there; its task is the ``Task`` example of
  docs/own-training-code.md): its own dataset, and a model with its own training function and task.

Both are listed in one workspace.yaml in that folder. Every command is ``python -m pipelines ...``
in a fresh process with PYTHONPATH naming only the repository and DAGSTER_HOME an empty folder:
nothing exported by hand, no instance config written beforehand. ``MatrixPlatform.cli`` keeps
each command's wall time, so the session can say what the matrix cost.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[2]
TEAM_TEMPLATE = Path(__file__).resolve().parent / "team_package"
TEAM_PACKAGE = "cellar"


def write_team_package(root: Path) -> Path:
    """The team's package under ``root`` (outside the repository), as ``cellar``: definitions,
    training function and task (the docs' "Your own Task" example, checked against that page by
    tests/docs)."""
    package = root / TEAM_PACKAGE
    shutil.copytree(TEAM_TEMPLATE, package, ignore=shutil.ignore_patterns("__pycache__"))
    return package


def write_workspace(path: Path, team_root: Path, *, platform_module: str = "tests.user_paths.platform_location",
                    team_package: str = TEAM_PACKAGE) -> Path:
    """A workspace of two locations: the platform's (``platform_module``, from the repository) and a
    team package's from ``team_root``, outside it (the soak writes its own with these arguments)."""
    path.write_text(
        "load_from:\n"
        "  - python_module:\n"
        f"      module_name: {platform_module}\n"
        "      attribute: defs\n"
        "      location_name: platform\n"
        f"      working_directory: {REPO}\n"
        "  - python_module:\n"
        f"      module_name: {team_package}.definitions\n"
        "      attribute: defs\n"
        f"      location_name: {team_package}\n"
        f"      working_directory: {team_root}\n")
    return path


@dataclass(frozen=True)
class Variant:
    name: str  # the path: "platform" or "team"
    model: str
    location: str
    team: str  # what its runs are tagged platform/team with
    id_column: str
    label: str
    features: tuple[str, ...]

    def frame(self) -> pd.DataFrame:
        """The pipeline's source rows, as its loader gives them."""
        if self.name == "platform":
            from pipelines.models.wine import load_wine_frame

            return load_wine_frame()
        from sklearn.datasets import load_iris

        data = load_iris(as_frame=True)
        frame = data.frame.rename(columns={**dict(zip(data.feature_names, self.features)), "target": self.label})
        frame.insert(0, self.id_column, [f"iris-{i:03d}" for i in range(len(frame))])
        return frame.drop_duplicates(subset=list(self.features))  # as team_package/definitions.py does


def _variants() -> dict[str, Variant]:
    from pipelines.models.wine import FEATURES as WINE

    return {
        "platform": Variant("platform", "wine", "platform", "oenology", "sample_id", "cultivar", tuple(WINE)),
        "team": Variant("team", "iris", TEAM_PACKAGE, TEAM_PACKAGE, "flower_id", "species",
                        ("sepal_length", "sepal_width", "petal_length", "petal_width")),
    }


VARIANTS = _variants()


@dataclass
class MatrixPlatform:
    root: Path  # a temporary folder outside the repository
    home: Path  # DAGSTER_HOME, empty at first
    workspace: Path
    timings: list[tuple[str, float]] = field(default_factory=list)
    runs: dict = field(default_factory=dict)  # (variant, what) -> CompletedProcess, each run once

    @classmethod
    def create(cls, root: Path) -> "MatrixPlatform":
        team_root = root / "team-code"
        team_root.mkdir(parents=True)
        write_team_package(team_root)
        home = root / "dagster-home"
        home.mkdir()
        return cls(root=root, home=home, workspace=write_workspace(root / "workspace.yaml", team_root))

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k not in ("DAGSTER_HOME", "PLATFORM_PROFILE", "PYTHONPATH") and not k.startswith(
                   ("TRAINING_RUNTIME_FAULT_", "DAGSTER_PIPES"))}
        return {**env, "DAGSTER_HOME": str(self.home), "PYTHONPATH": str(REPO), **extra}

    def cli(self, *args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
        """``python -m pipelines ARGS --workspace <this workspace>`` in a fresh process."""
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "pipelines", *args, "--workspace", str(self.workspace)],
                              cwd=REPO, env=self.env(**(env or {})), capture_output=True, text=True, timeout=timeout)
        self.timings.append((" ".join(args), time.perf_counter() - started))
        return proc

    def once(self, variant: Variant, what: str, *args: str, env: dict[str, str] | None = None):
        """Run a command for ``variant`` the first time a test asks; later tests share its result."""
        key = (variant.name, what)
        if key not in self.runs:
            self.runs[key] = self.cli(*args, env=env)
        return self.runs[key]

    # --- what the platform left behind -----------------------------------------------------------
    @property
    def data_root(self) -> Path:
        return self.home / "platform"

    def store(self):
        from pipelines.profiles import Profile

        return Profile(name="local", data_root=self.data_root).store()

    def lineage(self, model: str, version: int) -> dict:
        from core.registry import read_lineage

        return read_lineage(self.store(), model, version)

    def version_of_run(self, model: str, run_id: str) -> dict:
        """The lineage of the version run ``run_id`` registered."""
        from core.registry import list_versions

        records = [self.lineage(model, n) for n in list_versions(self.store(), model)]
        (record,) = [r for r in records if r["dagster"]["run_id"] == run_id]
        return record

    def weights(self, model: str, version: int) -> dict:
        from safetensors.torch import load

        from core.registry import version_prefix, version_tag

        return load(self.store().get_object(version_tag(model, version),
                                            version_prefix(model, version) + "model.safetensors"))

    def runs_of(self, model: str) -> list:
        """The runs that trained ``model``: its own job's, or its dataset's (a first training on a
        dataset of the location runs in the dataset's job)."""
        import dagster as dg

        with dg.DagsterInstance.from_config(str(self.home)) as instance:
            runs = instance.get_runs()
            return [r for r in runs if r.tags.get("platform/model") == model
                    or any(k.path[0] == model for k in (r.asset_selection or ()))]

    def launch_dirs(self, model: str, run_id: str) -> list[Path]:
        """The training step's launches (one per Dagster attempt) of run ``run_id``."""
        jobs = [p for p in (self.data_root / "launches").glob(f"{model}-{run_id[:8]}-*") if p.is_dir()]
        return sorted(d for job in jobs for d in (job / "logs").glob("launch_*"))

    def rank_logs(self, model: str, run_id: str) -> dict[str, str]:
        """Every rank's stderr of every attempt of the run's training, by path."""
        return {str(p): p.read_text(errors="replace") for d in self.launch_dirs(model, run_id)
                for p in sorted(d.rglob("stderr.log"))}

    def checkpoints(self, model: str, run_id: str) -> list[Path]:
        folder = self.data_root / "checkpoints" / model / run_id / "checkpoints"
        return sorted(p for p in folder.glob("step_*") if p.is_dir())

    def test_rows(self, variant: Variant, record: dict) -> pd.DataFrame:
        """The source rows of the version's test split: those the shards' split rule (a seeded hash
        of each row's id, recorded in the manifest) put there."""
        from assets.sharding import SPLITS, assign_splits

        manifest = json.loads(self.store().get_object(record["data"]["shards_commit"],
                                                      record["data"]["manifest_path"]))
        split = manifest["split"]
        assert split["by"] == variant.id_column, split
        frame = variant.frame()
        codes = assign_splits(frame[variant.id_column], split["seed"], tuple(split["fractions"][s] for s in SPLITS))
        return frame[codes == SPLITS.index("test")].reset_index(drop=True)

    def report_timings(self) -> str:
        total = sum(t for _, t in self.timings)
        lines = [f"{t:7.1f} s  python -m pipelines {what}" for what, t in self.timings]
        return "\n".join([*lines, f"{total:7.1f} s  in all ({len(self.timings)} commands)"])


def failure_lines(proc: subprocess.CompletedProcess) -> str:
    return "\n".join(line for line in proc.stderr.splitlines() if line.startswith(("FAILED", "error:")))
