"""The whole pipeline on the lakeFS backend (the unmodified SDK over real HTTP against the lakeFS-API
test server; workers read shards through its S3 gateway at the pinned commit), with planted secret
values that must never appear in logs, metadata, lineage records, commit metadata or exceptions."""

from __future__ import annotations

import json
import secrets

import pytest

from core.lineage import commit_ids
from core.registry import read_lineage
from tests.reliability.platforms import definitions, lakefs_store_resource, run_train, s3_credentials_in_env
from tests.support.lakefs_server import LakeFSTestServer

pytestmark = pytest.mark.slow


def test_lakefs_pipeline_publishes_and_never_leaks_secrets(tmp_path, monkeypatch, capfd, ledger):
    secret = "sk-" + secrets.token_hex(16)
    with LakeFSTestServer(tmp_path / "lakefs", access_key_id="AKIAPLATFORMTEST", secret_access_key=secret) as server:
        # Workers read s3:// shards through the gateway with credentials from the environment only.
        s3_credentials_in_env(monkeypatch, server.access_key_id, secret)
        store_resource = lakefs_store_resource(server, secret)
        defs = definitions(tmp_path / "platform", store_resource)
        result, errors, events = run_train(defs, tmp_path / "home")
        store = store_resource.get()
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
