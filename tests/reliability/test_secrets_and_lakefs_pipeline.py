"""The whole pipeline on the lakeFS backend (the unmodified SDK over real HTTP against the lakeFS-API
test server; workers read shards through its S3 gateway at the pinned commit), with planted secret
values that must never appear in logs, metadata, lineage records, commit metadata or exceptions."""

from __future__ import annotations

import dataclasses
import json
import secrets

import dagster as dg
import pytest

from assets.lineage import commit_ids
from assets.pipeline import build_pipeline_assets
from assets.registry import read_lineage
from pipelines.models.digits import digits_pipeline, write_digits_source
from resources.platform import ArtifactStoreResource, PlatformSettings, TrainingLauncherResource, VersionedStoreResource
from tests.support.lakefs_server import LakeFSTestServer

pytestmark = pytest.mark.slow


def test_lakefs_pipeline_publishes_and_never_leaks_secrets(tmp_path, monkeypatch, capfd, ledger):
    secret = "sk-" + secrets.token_hex(16)
    with LakeFSTestServer(tmp_path / "lakefs", access_key_id="AKIAPLATFORMTEST", secret_access_key=secret) as server:
        # Workers read s3:// shards through the gateway with credentials from the environment only.
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.access_key_id)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        root = tmp_path / "platform"
        write_digits_source(root / "sources")
        spec = dataclasses.replace(digits_pipeline, recipe=dataclasses.replace(digits_pipeline.recipe, epochs=3))
        store_resource = VersionedStoreResource(
            kind="lakefs", repository="platform-test", lakefs_endpoint=server.endpoint,
            lakefs_access_key_id=server.access_key_id, lakefs_secret_access_key=secret,
            lakefs_storage_namespace="local://platform-test")
        defs = dg.Definitions(
            assets=build_pipeline_assets(spec),
            jobs=[dg.define_asset_job("train", selection=dg.AssetSelection.groups("digits"))],
            resources={
                "platform": PlatformSettings(data_root=str(root)),
                "store": store_resource,
                "artifacts": ArtifactStoreResource(kind="local", local_root=str(root / "artifacts")),
                "launcher": TrainingLauncherResource(kind="local", work_root=str(root / "launches")),
            },
            executor=dg.in_process_executor,
        )
        (tmp_path / "home").mkdir()
        with dg.DagsterInstance.local_temp(str(tmp_path / "home")) as instance:
            result = defs.resolve_job_def("train").execute_in_process(instance=instance, raise_on_error=False)
            events = [e.to_json() if hasattr(e, "to_json") else str(e)
                      for e in instance.all_logs(result.run_id)]
        store = store_resource.get()
        errors = "\n".join(e.event_specific_data.error.message for e in result.all_events if e.is_step_failure)
        assert result.success, errors
        record = read_lineage(store, "digits")
        for name, cid in commit_ids(record).items():
            assert store.resolve_ref(cid) == cid, name
        # Shards were read at the pinned commit through the S3 gateway, not from a branch head.
        assert record["data"]["backend"] == "lakefs"
        commit_meta = [json.dumps(c.metadata) for c in store.log("main", limit=50)]
        out, err = capfd.readouterr()
        haystacks = {
            "event log": "\n".join(events), "lineage record": json.dumps(record), "commit metadata": "\n".join(commit_meta),
            "captured stdout/stderr": out + err, "store repr": repr(store), "failures": errors,
        }
        leaks = [where for where, text in haystacks.items() if secret in text]
        ledger.record("security: planted secrets scanned in every output", not leaks, result.success,
                      "lakeFS pipeline end to end; " + ", ".join(haystacks))
        assert not leaks, f"the secret leaked into: {leaks}"
        assert record["links"], "lineage carries lakeFS UI links on the lakeFS backend"
