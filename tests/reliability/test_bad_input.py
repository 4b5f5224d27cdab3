"""Names, paths, config values and files coming from users: each refused with a clear message."""

from __future__ import annotations

import pickle
import string

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.spec import PipelineDefinitionError, PipelineSpec, Source
from resources.store.base import MAX_REF_BYTES, StoreError, validate_object_path, validate_ref_name
from resources.store.local import LocalVersionedStore

REF_CHARS = string.ascii_letters + string.digits + "_-"


def _refused_with(fn, arg, message: str) -> bool | None:
    """True: refused with ``message``; False: accepted; an unexpected exception propagates."""
    try:
        fn(arg)
    except (StoreError, PipelineDefinitionError) as exc:
        assert message in str(exc), f"refused with an unclear message: {exc}"
        return True
    return False


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.text(min_size=1, max_size=300))
def test_ref_names_accepted_only_when_lakefs_would_accept_them(name, ledger):
    valid = len(name) <= MAX_REF_BYTES and name[0] in string.ascii_letters + string.digits + "_" and all(c in REF_CHARS for c in name)
    refused = _refused_with(validate_ref_name, name, "invalid branch name")
    ok = refused != valid and (refused or validate_ref_name(name) == name)
    ledger.record("bad input: branch and tag names (hypothesis)", ok, True)
    assert ok, f"{name!r}: valid={valid} but refused={refused}"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(st.sampled_from(["a", "b.txt", "..", ".", "", "x/../y", "\x00", "\n", "ok-1"]),
                      min_size=1, max_size=6),
       absolute=st.booleans())
def test_object_paths_never_escape(parts, absolute, ledger):
    path = ("/" if absolute else "") + "/".join(parts)
    components = path.split("/")
    bad = (absolute or not path or any(p in ("", ".", "..") for p in components)
           or any(ord(c) < 32 for c in path))
    refused = _refused_with(validate_object_path, path, "invalid object path")
    ok = refused == bad and (refused or validate_object_path(path) == path)
    ledger.record("bad input: object paths (hypothesis)", ok, True)
    assert ok, f"{path!r}: bad={bad} but refused={refused}"


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(["../etc/passwd", "/abs/path", "a/../../b", "a\x07b", "x" * 2000, "a//b", "./a"]))
def test_store_refuses_hostile_paths_before_writing(tmp_path, path, ledger):
    store = LocalVersionedStore(tmp_path, "repo")
    store.ensure_repository()
    refused = _refused_with(lambda p: store.put_object("main", p, b"x"), path, "invalid object path")
    untouched = not store.has_uncommitted_changes("main")
    ledger.record("bad input: hostile paths written to the store", refused, untouched)
    assert refused and untouched


@pytest.mark.parametrize("name", ["../evil", "Digits", "", "a" * 64, "name\n", "digits v2", "dígits"])
def test_model_names_from_users_are_refused(name, ledger):
    def define(n):
        PipelineSpec(name=n, source=Source(paths=("x.csv",)), feature_columns=("a",), label_column="y",
                     class_names=("0", "1"))

    refused = _refused_with(define, name, "field 'name'")
    ledger.record("bad input: model names", refused, True)
    assert refused


class _RunsCode:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        import os
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_that_runs_code_is_refused(tmp_path, ledger):
    """Even with a manifest whose checksum matches, weights_only loading refuses the pickle."""
    import hashlib
    import json
    import os

    from training_runtime.checkpoint.full import (
        MANIFEST_FILE,
        STATE_FILE,
        find_latest_valid,
        step_dir_name,
        write_checkpoint,
    )

    marker = tmp_path / "pwned"
    write_checkpoint(tmp_path, 1, {"step": 1, "w": torch.ones(2)})
    evil = write_checkpoint(tmp_path, 2, {"step": 2})
    payload = pickle.dumps({"step": 2, "x": _RunsCode(str(marker))})
    (evil / STATE_FILE).write_bytes(payload)
    manifest = json.loads((evil / MANIFEST_FILE).read_text())
    manifest["files"][STATE_FILE] = {"sha256": hashlib.sha256(payload).hexdigest(), "num_bytes": len(payload)}
    (evil / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(pickle.UnpicklingError):
        torch.load(evil / STATE_FILE, weights_only=True)
    path, state = find_latest_valid(tmp_path)
    ok = path.name == step_dir_name(1) and not marker.exists()
    ledger.record("security: code-running pickle refused", ok, state["step"] == 1)
    assert ok and state["step"] == 1
    assert not os.path.exists(marker)


def test_a_file_that_is_not_a_checkpoint_is_skipped_with_a_reason(tmp_path, caplog, ledger):
    from training_runtime.checkpoint.full import find_latest_valid, write_checkpoint

    write_checkpoint(tmp_path, 1, {"step": 1})
    bogus = tmp_path / "step_00000009"
    bogus.mkdir()
    (bogus / "manifest.json").write_text("this is not json")
    path, state = find_latest_valid(tmp_path)
    ok = state["step"] == 1 and "skipping corrupt checkpoint" in caplog.text
    ledger.record("bad input: checkpoint that is not a checkpoint", ok, state["step"] == 1)
    assert ok


def test_a_tampered_manifest_checksum_fails_before_training(tmp_path, ledger):
    from tests.runtime.helpers import make_dataset
    from training_runtime.data.shards import DataError, resolve_shards

    manifest, locations = make_dataset(tmp_path)
    manifest["splits"]["train"]["shards"][0]["sha256"] = "0" * 64
    try:
        resolve_shards(manifest, locations, "train", cache_dir=None)
        refused = False
    except DataError as exc:
        refused = "checksum mismatch" in str(exc)
    ledger.record("bad input: tampered manifest checksum", refused, True)
    assert refused


@pytest.mark.parametrize("path, value", [
    (("train", "epochs"), -1), (("train", "batch_size"), "many"), (("train", "optimizer"), "adamm"),
    (("checkpoint", "every_steps"), 0), (("model", "name"), "no_such_model"),
])
def test_malformed_config_values_name_the_field(tmp_path, path, value, ledger):
    from tests.runtime.helpers import make_config, make_dataset
    from training_runtime.config import ConfigError, RunConfig

    manifest, locations = make_dataset(tmp_path)
    cfg = make_config(tmp_path, manifest, locations)
    cfg[path[0]][path[1]] = value
    try:
        RunConfig.from_dict(cfg)
        refused = False
    except (ConfigError, ValueError) as exc:
        refused = (path[1] if path[1] != "name" else "model") in str(exc)
    ledger.record("bad input: malformed config values", refused, True)
    assert refused, f"{path} = {value!r} was not refused with a message naming it"
