"""Object storage for checkpoints, weights and other large artifacts: local disk by default,
S3 in the Kubernetes profile. Keys are relative '/'-separated paths."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path


class ArtifactError(Exception):
    """A failed artifact read or write, with a message that says what to fix."""


class ArtifactStore(ABC):
    @abstractmethod
    def put_file(self, local_path: Path, key: str) -> str:
        """Upload atomically (readers never see a partial object); return the artifact's URI."""

    @abstractmethod
    def get_file(self, key: str, dest: Path) -> Path:
        """Download ``key`` to ``dest``; raise ArtifactError if it does not exist."""

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def list_keys(self, prefix: str = "") -> list[str]: ...

    @abstractmethod
    def delete(self, key: str) -> None: ...

    @abstractmethod
    def uri(self, key: str) -> str:
        """file:///abs/path or s3://bucket/prefix/key."""


# Local uploads are written here first and renamed into place, so readers never see them.
INCOMING_DIR = ".incoming"


def validate_key(key: str) -> str:
    """Keys are relative '/'-separated paths that cannot escape the store's root or prefix."""
    if not isinstance(key, str) or not key:
        raise ArtifactError("invalid artifact key: it is empty; give a relative path such as 'digits/v1/model.pt'")
    if len(key.encode()) > 1024:
        raise ArtifactError(f"invalid artifact key {key[:40]!r}...: longer than 1024 bytes")
    if any(ord(c) < 32 or ord(c) == 127 for c in key):
        raise ArtifactError(f"invalid artifact key {key!r}: it contains control characters")
    if key.startswith("/") or "\\" in key:
        raise ArtifactError(f"invalid artifact key {key!r}: it must be relative and use '/' separators")
    parts = key.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ArtifactError(f"invalid artifact key {key!r}: empty, '.' or '..' components are not allowed")
    if parts[0] == INCOMING_DIR:
        raise ArtifactError(f"invalid artifact key {key!r}: {INCOMING_DIR!r} is reserved for uploads in progress")
    return key

