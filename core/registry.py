"""Model versions in the versioned store: version N of model M is the tag ``M-vN`` on the commit
that holds ``models/M/versions/vN/`` (weights, lineage record, resolved config).

Comments on versions live under ``models/M/comments/vN/`` and the ``production`` alias under
``models/M/aliases/production.json``, both on ``main``."""

from __future__ import annotations

import json
import re
import uuid
from datetime import datetime, timezone

from core.identity import Actor, audit_fields
from resources.store.base import MAIN, MergeConflictError, RefNotFoundError, VersionedStore


class UnknownModelVersionError(LookupError):
    """A model or version that the store does not hold."""


def version_tag(model: str, version: int) -> str:
    return f"{model}-v{version}"


def version_prefix(model: str, version: int) -> str:
    return f"models/{model}/versions/v{version}/"


def lineage_path(model: str, version: int) -> str:
    return version_prefix(model, version) + "lineage.json"


def _tags(store: VersionedStore) -> dict[str, str]:
    try:
        return store.list_tags()
    except RefNotFoundError as exc:
        raise UnknownModelVersionError(
            f"the store holds no model versions yet ({exc}); run `python -m pipelines demo` or a training job first"
        ) from exc


def list_versions(store: VersionedStore, model: str) -> list[int]:
    pattern = re.compile(rf"^{re.escape(model)}-v(\d+)$")
    return sorted(int(m.group(1)) for t in _tags(store) if (m := pattern.match(t)))


def list_models(store: VersionedStore) -> list[str]:
    return sorted({m.group(1) for t in _tags(store) if (m := re.match(r"^(.+)-v\d+$", t))})


def next_version(store: VersionedStore, model: str) -> int:
    """One past the highest registered version (and past any version already on ``main``)."""
    taken = list_versions(store, model)
    on_main = {
        int(m.group(1))
        for o in store.list_objects("main", prefix=f"models/{model}/versions/")
        if (m := re.match(rf"^models/{re.escape(model)}/versions/v(\d+)/", o.path))
    }
    return max([0, *taken, *on_main]) + 1


def read_lineage(store: VersionedStore, model: str, version: int | None = None) -> dict:
    versions = list_versions(store, model)
    if not versions:
        known = list_models(store)
        raise UnknownModelVersionError(
            f"model {model!r} has no registered versions" + (f"; known models: {', '.join(known)}" if known else "")
        )
    v = versions[-1] if version is None else version
    if v not in versions:
        raise UnknownModelVersionError(
            f"model {model!r} has no version {v}; registered versions: {', '.join(map(str, versions))}"
        )
    try:
        return json.loads(store.get_object(version_tag(model, v), lineage_path(model, v)))
    except RefNotFoundError as exc:
        raise UnknownModelVersionError(f"version {v} of {model!r} is tagged but its lineage record is missing: {exc}") from exc


# --- notes on versions and the production alias ------------------------------------------------
# Both live as plain JSON files on ``main``, written through a short-lived branch and merged, so
# they carry commit metadata (who, when, what) and travel with the store like everything else.
# Tags cannot move, so the alias is a pointer file with its full audit history.
# Who: the identity the platform verified (core/identity.py: ``by`` is its user, ``actor`` how it
# was verified); a name the user typed is only a ``note``.

PRODUCTION = "production"


class AliasError(ValueError):
    """A promote or rollback that cannot be done as asked."""


def comments_prefix(model: str, version: int | None = None) -> str:
    return f"models/{model}/comments/" + (f"v{version}/" if version is not None else "")


def alias_path(model: str, alias: str = PRODUCTION) -> str:
    return f"models/{model}/aliases/{alias}.json"


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def publish_files(store: VersionedStore, files: dict[str, bytes], message: str, metadata: dict[str, str],
                  branch_prefix: str) -> str:
    """Write ``files`` on a fresh branch from ``main``, commit, merge into ``main``; return main's head.

    A concurrent writer of the same path makes the merge conflict and leaves ``main`` untouched.
    The branch is deleted either way.
    """
    store.ensure_repository()
    branch = f"{branch_prefix}-{uuid.uuid4().hex[:12]}"
    store.create_branch(branch, MAIN)
    try:
        for path, data in files.items():
            store.put_object(branch, path, data)
        store.commit(branch, message, metadata)
        return store.merge(branch, MAIN, message, metadata)
    finally:
        store.delete_branch(branch)


def add_comment(store: VersionedStore, model: str, version: int, text: str, actor: Actor,
                note: str | None = None, created_at: str | None = None) -> dict:
    """Record a note on a version under ``models/M/comments/vN/`` on ``main``; return it.

    ``author`` is the verified ``actor``'s user; ``note`` (e.g. on whose behalf) is shown beside it."""
    who = audit_fields(actor, note)
    read_lineage(store, model, version)  # unknown model or version: UnknownModelVersionError
    if not text.strip():
        raise ValueError("the comment is empty; give the text to record")
    note_id = uuid.uuid4().hex[:12]
    record = {"model": model, "version": version, "text": text, "author": who["by"], "actor": who["actor"],
              "note": who["note"], "created_at": created_at or utc_now(), "id": note_id}
    stamp = re.sub(r"[^0-9T]", "", record["created_at"])[:15]
    path = comments_prefix(model, version) + f"{stamp}-{note_id}.json"
    head = publish_files(store, {path: json.dumps(record, indent=2, sort_keys=True).encode()},
                         f"Comment on {model} v{version}",
                         {"model": model, "model_version": str(version), "kind": "comment",
                          **audit_metadata(who, "author")},
                         "comment")
    return {**record, "path": path, "commit_id": head}


def audit_metadata(who: dict, by_key: str = "by") -> dict[str, str]:
    """An audit entry's identity as commit metadata (strings only)."""
    meta = {by_key: who["by"], f"{by_key}_verified_by": who["actor"]["verified_by"],
            f"{by_key}_authenticated": str(who["actor"]["authenticated"]).lower()}
    if who["note"]:
        meta["note"] = who["note"]
    return meta


def list_comments(store: VersionedStore, model: str, version: int | None = None) -> list[dict]:
    """Comments on one version (or all versions) of ``model``, oldest first."""
    objects = store.list_objects(MAIN, prefix=comments_prefix(model, version))
    notes = [json.loads(store.get_object(MAIN, o.path)) for o in objects if o.path.endswith(".json")]
    return sorted(notes, key=lambda n: (n["created_at"], n["id"]))


def read_alias(store: VersionedStore, model: str, alias: str = PRODUCTION) -> dict:
    """The alias state: ``{"version": N or None, "previous": [...], "history": [...]}``."""
    path = alias_path(model, alias)
    if not store.exists(MAIN, path):
        return empty_alias(model, alias)
    return json.loads(store.get_object(MAIN, path))


def empty_alias(model: str, alias: str = PRODUCTION) -> dict:
    return {"model": model, "alias": alias, "version": None, "previous": [], "history": []}


def promoted(state: dict, version: int, actor: Actor, at: str, note: str | None = None) -> dict:
    """The alias state after pointing it at ``version``; the old target can be rolled back to."""
    who = audit_fields(actor, note)
    current = state["version"]
    if current == version:
        raise AliasError(f"{state['model']} v{version} is already in {state['alias']}")
    entry = {"action": "promote", "from": current, "to": version, **who, "at": at}
    previous = [*state["previous"], current] if current is not None else list(state["previous"])
    return {**state, "version": version, "previous": previous, "history": [*state["history"], entry]}


def rolled_back(state: dict, actor: Actor, at: str, note: str | None = None) -> dict:
    """The alias state after returning to the version it pointed at before the current one."""
    who = audit_fields(actor, note)
    if state["version"] is None:
        raise AliasError(f"{state['model']} has no {state['alias']} version to roll back; promote one first")
    if not state["previous"]:
        raise AliasError(
            f"{state['model']} v{state['version']} is the first {state['alias']} version; "
            "there is no earlier one to roll back to")
    *rest, target = state["previous"]
    entry = {"action": "rollback", "from": state["version"], "to": target, **who, "at": at}
    return {**state, "version": target, "previous": rest, "history": [*state["history"], entry]}


def move_alias(store: VersionedStore, model: str, action: str, actor: Actor, version: int | None = None,
               alias: str = PRODUCTION, at: str | None = None, note: str | None = None) -> dict:
    """Promote ``version`` to, or roll back, the alias on ``main``; return the audit entry.

    ``actor`` is the identity the platform verified (core.identity.resolve_actor); ``note`` is shown beside it."""
    at = at or utc_now()
    state = read_alias(store, model, alias)
    if action == "promote":
        read_lineage(store, model, version)  # unknown model or version: UnknownModelVersionError
        new = promoted(state, version, actor, at, note)
    elif action == "rollback":
        read_lineage(store, model)  # unknown model: UnknownModelVersionError
        new = rolled_back(state, actor, at, note)
    else:
        raise ValueError(f"unknown alias action {action!r}; use 'promote' or 'rollback'")
    entry = new["history"][-1]
    meta = {"model": model, "alias": alias, "action": action, "from_version": str(entry["from"]),
            "to_version": str(entry["to"]), "at": at, **audit_metadata(entry)}
    try:
        head = publish_files(store, {alias_path(model, alias): json.dumps(new, indent=2, sort_keys=True).encode()},
                             f"{action.capitalize()} {model} {alias}: v{entry['from']} -> v{entry['to']}", meta,
                             f"alias-{alias}")
    except MergeConflictError as exc:
        raise AliasError(f"someone else moved {model}'s {alias} alias at the same time; "
                         f"run the command again ({exc})") from exc
    return {**entry, "commit_id": head}
