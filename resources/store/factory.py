"""Build the configured VersionedStore from explicit settings (no environment reads here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from resources.store.base import StoreError, VersionedStore

KINDS = ("local", "lakefs")


def make_store(kind: str, **settings: Any) -> VersionedStore:
    """``kind`` is "local" (root, repository) or "lakefs" (endpoint, access_key_id,
    secret_access_key, repository, storage_namespace, ...: see LakeFSVersionedStore)."""
    if kind == "local":
        _require(kind, settings, ("root", "repository"))
        from resources.store.local import LocalVersionedStore

        unknown = set(settings) - {"root", "repository"}
        if unknown:
            raise StoreError(f"unknown settings for the local store: {sorted(unknown)}; it takes root and repository")
        return LocalVersionedStore(Path(settings["root"]), settings["repository"])
    if kind == "lakefs":
        _require(kind, settings, ("endpoint", "access_key_id", "secret_access_key", "repository"))
        # Imported lazily: the embedded default must not need the lakeFS SDK to start.
        from resources.store.lakefs import LakeFSVersionedStore

        try:
            return LakeFSVersionedStore(**settings)
        except TypeError as exc:
            raise StoreError(f"bad settings for the lakeFS store: {exc}") from None
    raise StoreError(f"unknown store kind {kind!r}; use one of {KINDS}")


def _require(kind: str, settings: dict[str, Any], names: tuple[str, ...]) -> None:
    missing = [n for n in names if settings.get(n) in (None, "")]
    if missing:
        raise StoreError(f"the {kind} store needs settings {missing}; pass them to make_store")
