"""The versioned dataset store: one interface, a local implementation and a lakeFS one."""

from resources.store.base import (
    Commit,
    DiffEntry,
    MergeConflictError,
    ObjectInfo,
    RefNotFoundError,
    StoreError,
    VersionedStore,
)

__all__ = [
    "Commit",
    "DiffEntry",
    "MergeConflictError",
    "ObjectInfo",
    "RefNotFoundError",
    "StoreError",
    "VersionedStore",
]
