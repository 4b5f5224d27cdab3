"""Definitions of the digits pipeline on chosen backends, for the reliability tests."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import dagster as dg

from assets.pipeline import build_pipeline_assets
from pipelines.definitions import build_definitions, training_job_name
from pipelines.models.digits import digits_pipeline, write_digits_source
from pipelines.profiles import Profile
from resources.platform import ArtifactStoreResource, PlatformSettings, TrainingLauncherResource, VersionedStoreResource


def small_digits(epochs: int = 3):
    return dataclasses.replace(digits_pipeline, recipe=dataclasses.replace(digits_pipeline.recipe, epochs=epochs))


def lakefs_store_resource(server, secret: str, repository: str = "platform-test") -> VersionedStoreResource:
    return VersionedStoreResource(
        kind="lakefs", repository=repository, lakefs_endpoint=server.endpoint,
        lakefs_access_key_id=server.access_key_id, lakefs_secret_access_key=secret,
        lakefs_storage_namespace=f"local://{repository}")


def s3_credentials_in_env(monkeypatch, access_key_id: str, secret_access_key: str) -> None:
    """Training workers read s3:// objects (the lakeFS gateway, or S3 itself) with credentials
    from their environment only, as in a pod."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", access_key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret_access_key)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


def definitions(root: Path, store: VersionedStoreResource, artifacts: ArtifactStoreResource | None = None,
                spec=None) -> dg.Definitions:
    spec = spec or small_digits()
    write_digits_source(root / "sources")
    return dg.Definitions(
        assets=build_pipeline_assets(spec),
        jobs=[dg.define_asset_job("train", selection=dg.AssetSelection.groups(spec.name))],
        resources={
            "platform": PlatformSettings(data_root=str(root)),
            "store": store,
            "artifacts": artifacts or ArtifactStoreResource(kind="local", local_root=str(root / "artifacts")),
            "launcher": TrainingLauncherResource(kind="local", work_root=str(root / "launches")),
        },
        executor=dg.in_process_executor,
    )


def run_train(defs: dg.Definitions, home: Path, stages: list[str] | None = None, model: str = "digits"):
    """Run the job (or only ``stages`` of it) on the instance at ``home``, which persists between calls."""
    home.mkdir(parents=True, exist_ok=True)
    selection = [dg.AssetKey([model, s]) for s in stages] if stages else None
    with dg.DagsterInstance.local_temp(str(home)) as instance:
        result = defs.resolve_job_def("train").execute_in_process(instance=instance, raise_on_error=False,
                                                                  asset_selection=selection)
        events = [str(e) for e in instance.all_logs(result.run_id)]
    errors = "\n".join(_chain(e.event_specific_data.error) for e in result.all_events if e.is_step_failure)
    return result, errors, events


def _chain(error) -> str:
    """A step failure's message with its causes (a retried step's own message is only
    "Exceeded max_retries")."""
    parts = []
    while error is not None:
        parts.append(error.message.strip())
        error = error.cause
    return " <- ".join(parts)


def published_whole_or_untouched(store, main_before: str, model: str = "digits") -> bool:
    """Main is where it was, or holds complete versions (record and weights) only."""
    if store.resolve_ref("main") == main_before:
        return True
    paths = {o.path for o in store.list_objects("main", prefix=f"models/{model}/versions/")}
    versions = {p.split("/")[3] for p in paths}
    return all({f"models/{model}/versions/{v}/lineage.json", f"models/{model}/versions/{v}/model.safetensors"} <= paths
               for v in versions) and bool(versions)


# ---------------------------------------------------------------- the instance the GraphQL load reads

def seed_load_instance(home: Path, trainings: int = 0) -> None:
    """What the GraphQL load reads, on the instance at ``home`` (its dagster.yaml, local or
    production): two runs of digits' data stages, the instance the load was first measured on;
    then ``trainings`` full trainings of digits, so the checkpoint has its live-telemetry
    observations and the versions their evaluation metadata, as on a platform in use."""
    profile = Profile(name="local", data_root=home / "platform")
    write_digits_source(profile.data_root / "sources")
    # Only digits: the YAML pipelines that share its dataset would train too, for nothing the load reads.
    job = build_definitions(profile, [digits_pipeline], with_yaml=False).resolve_job_def(
        training_job_name(digits_pipeline))
    data_stages = [dg.AssetKey(["digits", "raw_dataset"]), dg.AssetKey(["digits", "shards"])]
    with dg.DagsterInstance.from_config(str(home)) as instance:
        for selection in [data_stages] * 2 + [None] * trainings:
            result = job.execute_in_process(instance=instance, asset_selection=selection, raise_on_error=False)
            if not result.success:
                errors = "\n".join(_chain(e.event_specific_data.error) for e in result.all_events if e.is_step_failure)
                raise RuntimeError(f"seeding the load's instance at {home}: run {result.run_id} failed:\n{errors}")
