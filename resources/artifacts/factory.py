"""Build the configured ArtifactStore from explicit settings (no environment reads here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from resources.artifacts.base import ArtifactError, ArtifactStore

KINDS = ("local", "s3")


def make_artifact_store(kind: str, **settings: Any) -> ArtifactStore:
    """``kind`` is "local" (root) or "s3" (bucket, prefix, endpoint_url, region, session or
    access_key_id/secret_access_key, retry and multipart settings: see S3ArtifactStore)."""
    if kind == "local":
        if not settings.get("root"):
            raise ArtifactError("the local artifact store needs a root directory; pass root=...")
        unknown = set(settings) - {"root"}
        if unknown:
            raise ArtifactError(f"unknown settings for the local artifact store: {sorted(unknown)}; it takes root")
        from resources.artifacts.local import LocalArtifactStore

        return LocalArtifactStore(Path(settings["root"]))
    if kind == "s3":
        if not settings.get("bucket"):
            raise ArtifactError("the S3 artifact store needs a bucket; pass bucket=...")
        # Imported lazily so the local default does not load boto3.
        from resources.artifacts.s3 import S3ArtifactStore

        try:
            return S3ArtifactStore(**settings)
        except TypeError as exc:
            raise ArtifactError(f"bad settings for the S3 artifact store: {exc}") from None
    raise ArtifactError(f"unknown artifact store kind {kind!r}; use one of {KINDS}")
