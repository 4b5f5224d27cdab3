"""Registering a model version: commit the record and weights, publish to main, tag."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from core.lineage import lineage_bytes, lineage_sha256
from core.registry import lineage_path, list_versions, next_version, version_prefix, version_tag
from resources.store.base import MAIN, MergeConflictError, StoreError, VersionedStore


@dataclass(frozen=True)
class Registered:
    version: int
    commit_id: str
    main_commit_id: str
    tag: str
    branch: str


def register_version(
    store: VersionedStore, branch: str, model: str, record_for: Callable[[int], dict], files: dict[str, bytes],
    metadata: dict[str, str], attempts: int = 5,
) -> Registered:
    """Commit version N's files (``files``: name -> bytes, e.g. model.safetensors, model_card.json,
    tokenizer.json, model.onnx) and its lineage record on the run branch, merge it into ``main``,
    tag that commit.

    N is one past the highest version. Two runs registering at once both write
    ``models/M/versions/vN/``; the later merge conflicts on that path and leaves ``main``
    untouched. It then branches again from its last commit before the version files and takes
    N+1. A conflict on any other path (two runs changed the same data) is a real conflict and
    fails with the paths.
    """
    repair_untagged_versions(store, model)
    base_commit = store.resolve_ref(branch)
    for attempt in range(1, attempts + 1):
        version = next_version(store, model)
        prefix = version_prefix(model, version)
        for name, data in sorted(files.items()):
            store.put_object(branch, prefix + name, data)
        written = lineage_bytes(record_for(version))
        store.put_object(branch, lineage_path(model, version), written)
        meta = {**metadata, "model_version": str(version), "lineage_sha256": lineage_sha256(written)}
        commit = store.commit(branch, f"Register {model} v{version}", meta)
        try:
            main_head = store.merge(branch, MAIN, f"Publish {model} v{version}", meta)
        except MergeConflictError as exc:
            if any(not p.startswith(f"models/{model}/versions/") for p in exc.paths) or not exc.paths:
                raise
            branch = f"{branch}-r{attempt}"
            store.create_branch(branch, base_commit, exist_ok=False)
            continue
        tag = version_tag(model, version)
        store.create_tag(tag, commit.id)
        return Registered(version=version, commit_id=commit.id, main_commit_id=main_head, tag=tag, branch=branch)
    raise StoreError(
        f"could not register a version of {model!r}: {attempts} attempts lost the race for a version number; "
        "retry the run"
    )


def repair_untagged_versions(store: VersionedStore, model: str) -> list[str]:
    """Tag versions that reached ``main`` but lost their tag (the store failed between the merge
    and the tag). Main already holds their complete files; the tag goes on the merge commit
    that published them, found by its ``model_version`` metadata."""
    tagged = set(list_versions(store, model))
    on_main = {int(o.path.split("/")[3][1:]) for o in store.list_objects(MAIN, prefix=f"models/{model}/versions/")
               if o.path.endswith("/lineage.json")}
    repaired = []
    for version in sorted(on_main - tagged):
        publishing = next((c for c in store.log(MAIN, limit=1000) if c.metadata.get("model_version") == str(version)
                           and c.message.startswith(f"Publish {model} v{version}")), None)
        if publishing is None:
            raise StoreError(f"{model} v{version} is on main without a tag or the commit that published it; "
                             "inspect the store's main branch")
        tag = version_tag(model, version)
        store.create_tag(tag, publishing.id)
        repaired.append(tag)
    return repaired
