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
