"""Registering versions: numbering, races and repair after a store failure."""

from resources.store.local import LocalVersionedStore


def _store(tmp_path):
    s = LocalVersionedStore(tmp_path, "repo")
    s.ensure_repository()
    return s


def test_a_version_published_without_its_tag_is_tagged_on_the_next_registration(tmp_path):
    from core.registry import list_versions
    from core.versions import register_version

    s = _store(tmp_path)
    s.create_branch("run-a", "main")
    s.put_object("run-a", "models/m/versions/v1/lineage.json", b"{}")
    s.commit("run-a", "Register m v1", {"model_version": "1"})
    s.merge("run-a", "main", "Publish m v1", {"model_version": "1"})  # then the store failed: no tag
    assert list_versions(s, "m") == []
    s.create_branch("run-b", "main")
    reg = register_version(s, "run-b", "m", lambda v: {"version": v}, {"model.safetensors": b"w"}, {})
    assert reg.version == 2
    assert list_versions(s, "m") == [1, 2]
    assert s.get_object("m-v1", "models/m/versions/v1/lineage.json") == b"{}"


def test_two_runs_racing_for_a_version_number_both_register(tmp_path, monkeypatch):
    import core.versions as versions
    from core.registry import list_versions, next_version, read_lineage
    from core.versions import register_version

    s = _store(tmp_path)
    for run in ("a", "b"):
        s.create_branch(f"run-{run}", "main")
        s.put_object(f"run-{run}", f"models/m/checkpoints/{run}/model.safetensors", run.encode())
        s.commit(f"run-{run}", f"train {run}", {})
    # Both computed "v1" before either merged: the second merge conflicts on the version path.
    first = register_version(s, "run-a", "m", lambda v: {"version": v, "run": "a"}, {"model.safetensors": b"a"}, {})
    stale = iter([1])  # run b read the version number before run a published v1
    monkeypatch.setattr(versions, "next_version", lambda store, model: next(stale, None) or next_version(store, model))
    second = register_version(s, "run-b", "m", lambda v: {"version": v, "run": "b"}, {"model.safetensors": b"b"}, {})
    assert (first.version, second.version) == (1, 2)
    assert list_versions(s, "m") == [1, 2]
    assert read_lineage(s, "m", 2)["run"] == "b"
