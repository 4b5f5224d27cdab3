"""A whole pipeline, source to registered version, whose training is an elastic gang of 3 pods
run by the pod simulation: the platform's definitions (raw dataset, shards, checkpoint, model
version) are materialized in one run with the Kubernetes launcher against a LocalCluster, wired
as the soak's Kubernetes path wires it (tests/reliability/soak/cluster.py). Mid-training one
training pod loses its processes (SIGTERM to each, as a kubelet ends a deleted or preempted pod):
the gang goes on with 2 from the checkpoint every rank wrote on the notice, the Job controller
replaces the pod 25 s later and the replacement joins, so the training ends on 3. The version
registered says so: its lineage has the resizes row, the run's log the resize lines, and the live
view (the checkpoint asset's telemetry observations, which its Plots chart) a world_size that
steps from 3 to 2 and back."""

from __future__ import annotations

import dataclasses
import itertools
import json
import signal
import time
from pathlib import Path

import dagster as dg
import pytest

from core.lineage import lineage_rows
from core.registry import list_versions, read_lineage
from pipelines.api import model_pipeline
from pipelines.definitions import build_definitions, training_job_name
from pipelines.models.wine import FEATURES, load_wine_frame
from pipelines.profiles import Profile
from tests.k8s.local_cluster import signal_tree_when
from tests.reliability.soak.cluster import ELASTIC_REPLACEMENT_S, SimulatedClusterLauncherResource

pytestmark = pytest.mark.slow

# 3 pods of one gloo rank, 2 at least; 24 divides among 2 and 3 ranks. Rank 0 takes 0.4 s a
# step (the runtime's own pacing hook), so the training outlasts the loss, the re-formation and
# the replacement's 25 s: about 150 steps, 60 s of steps.
RECIPE = {"epochs": 30, "batch_size": 24, "lr": 0.01, "world_size": 1, "nnodes": 3, "min_nodes": 2,
          "max_restarts": 3, "checkpoint_every_steps": 4}
STEP_S = 0.4
LOSE_AFTER_STEP = 8


@dataclasses.dataclass(frozen=True)
class PodSimulationProfile(Profile):
    """The local profile (local store and artifacts, in-process steps) whose training launcher is
    the Kubernetes one against the pod simulation."""

    def resources(self) -> dict[str, dg.ConfigurableResource]:
        resources = super().resources()
        resources["launcher"] = SimulatedClusterLauncherResource(
            kind="kubernetes", work_root=str(self.data_root), cluster_root=str(self.data_root / "cluster"),
            pod_env={"TRAINING_RUNTIME_FAULT_SLOW_RANK": f"0:{STEP_S}"})
        return resources


def _pod_of_index(cluster_root: Path, index: int) -> tuple[str, int] | None:
    """(name, pid) of the live training pod ``index`` from the simulated API server's registry."""
    for entry in (cluster_root / "jobs").glob("*.json"):
        for name, pid in json.loads(entry.read_text())["pods"].items():
            if name.rsplit("-", 2)[-2] == str(index) and "-rdzv" not in name:
                return name, pid
    return None


def _pod_1_after_the_checkpoint(data_root: Path) -> tuple[str, int] | None:
    if list(data_root.glob(f"checkpoints/*/*/checkpoints/step_{LOSE_AFTER_STEP:09d}")):
        return _pod_of_index(data_root / "cluster", 1)  # SIGTERM to its tree: the kubelet ends the pod
    return None


def test_an_elastic_pipeline_loses_a_pod_grows_back_and_registers_a_version(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    profile = PodSimulationProfile(name="local", data_root=home / "platform")
    spec = model_pipeline("wine_elastic", source=load_wine_frame, features=FEATURES, label="cultivar",
                          classes=range(3), id_column="sample_id", model="mlp", model_kwargs={"hidden_sizes": [16]},
                          recipe=RECIPE, split={"seed": 1, "samples_per_shard": 64})
    job = build_definitions(profile, [spec], with_yaml=False).resolve_job_def(training_job_name(spec))
    lost = signal_tree_when(lambda: _pod_1_after_the_checkpoint(profile.data_root), signal.SIGTERM, timeout_s=300)
    started = time.monotonic()
    with dg.DagsterInstance.from_config(str(home)) as instance:
        result = job.execute_in_process(instance=instance, raise_on_error=False)
        logged = [e.user_message for e in instance.all_logs(result.run_id)]
        # The live view: each telemetry message is an observation of the checkpoint asset, which
        # its Plots chart; an elastic gang's carry the group's world size.
        observed = [e.dagster_event.asset_observation_data.asset_observation
                    for e in instance.all_logs(result.run_id, of_type=dg.DagsterEventType.ASSET_OBSERVATION)]
    took = time.monotonic() - started
    pod_logs = {p.name: p.read_text()[-2500:] for p in (profile.data_root / "cluster").glob("*/*.log")}
    failures = [e.event_specific_data.error.message for e in result.all_events if e.is_step_failure]
    assert result.success, "\n".join(failures + [f"== {k}\n{v}" for k, v in sorted(pod_logs.items())])
    assert lost, "no pod was lost: the training never published checkpoint 8"
    # The Job controller replaced pod 1: its replacement logged beside the one lost.
    assert any(name.endswith("-1.1.log") for name in pod_logs), sorted(pod_logs)

    (metrics_path,) = profile.data_root.glob("checkpoints/wine_elastic/*/output/metrics.json")
    metrics = json.loads(metrics_path.read_text())
    resolved = json.loads((metrics_path.parent / "resolved_config.json").read_text())
    assert [a["world_size"] for a in metrics["attempts"]] == [3, 2, 3], metrics["attempts"]
    assert [(r["from_world_size"], r["to_world_size"]) for r in metrics["resizes"]] == [(3, 2), (2, 3)]
    # Told to stop, every rank checkpointed where it was: the smaller gang resumed there, past
    # the checkpoint that triggered the loss, and nothing was trained twice to the end.
    assert metrics["resizes"][0]["resumed_from_step"] >= LOSE_AFTER_STEP
    assert metrics["steps"] == resolved["total_steps"] and resolved["elastic"] == "2:3"
    assert resolved["world_size"] == 3  # the group that finished, and saved the weights

    store = profile.store()
    assert list_versions(store, "wine_elastic") == [1]
    record = read_lineage(store, "wine_elastic", 1)
    assert [(r["from_world_size"], r["to_world_size"]) for r in record["training"]["resizes"]] == [(3, 2), (2, 3)]
    (row,) = [r for r in lineage_rows(record) if r.field == "resizes"]
    assert row.value.startswith("2: 3 -> 2 ranks from step") and "; 2 -> 3 ranks from step" in row.value, row.value
    assert any("the gang resized from 3 to 2 ranks" in (m or "") for m in logged)
    assert any("the gang resized from 2 to 3 ranks" in (m or "") for m in logged)
    # The resizes in the live plots: world_size steps from 3 to 2 and back, at the steps the
    # smaller and the regrown groups resumed from.
    points = [(o.metadata["step"].value, o.metadata["world_size"].value) for o in observed
              if o.description.startswith("training telemetry") and "world_size" in o.metadata]
    assert [size for size, _ in itertools.groupby(w for _, w in points)] == [3, 2, 3], points
    first_at_2 = next(step for step, w in points if w == 2)
    assert first_at_2 > metrics["resizes"][0]["resumed_from_step"], (points, metrics["resizes"])
    # The replacement came ELASTIC_REPLACEMENT_S after the loss and joined a running training.
    assert took > ELASTIC_REPLACEMENT_S
