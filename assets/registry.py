"""Model versions in the versioned store: version N of model M is the tag ``M-vN`` on the commit
that holds ``models/M/versions/vN/`` (weights, lineage record, resolved config)."""

from __future__ import annotations

import json
import re

from resources.store.base import RefNotFoundError, VersionedStore


class UnknownModelVersionError(LookupError):
    """A model or version that the store does not hold."""


def version_tag(model: str, version: int) -> str:
    return f"{model}-v{version}"


def version_prefix(model: str, version: int) -> str:
    return f"models/{model}/versions/v{version}/"


def lineage_path(model: str, version: int) -> str:
    return version_prefix(model, version) + "lineage.json"


def list_versions(store: VersionedStore, model: str) -> list[int]:
    pattern = re.compile(rf"^{re.escape(model)}-v(\d+)$")
    return sorted(int(m.group(1)) for t in store.list_tags() if (m := pattern.match(t)))


def list_models(store: VersionedStore) -> list[str]:
    return sorted({m.group(1) for t in store.list_tags() if (m := re.match(r"^(.+)-v\d+$", t))})


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
