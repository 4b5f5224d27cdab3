"""The pinned-shards read: a shards commit's manifest and every shard's location at that commit.

Training, evaluation and ``reproduce`` all read shards this way, so workers never read a moving
branch head and the three cannot drift apart.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from resources.store.base import VersionedStore


@dataclass(frozen=True)
class PinnedShards:
    commit_id: str
    manifest_path: str
    manifest: dict
    locations: dict[str, str]  # shard path (relative to the manifest) -> URI pinned at commit_id
    s3_endpoint_url: str | None  # where s3:// locations are served (lakeFS's gateway), if anywhere

    @property
    def prefix(self) -> str:
        return self.manifest_path.rsplit("/", 1)[0] + "/"


def _shard_locations(store: VersionedStore, commit_id: str, prefix: str, manifest: dict) -> dict[str, str]:
    """Every shard's pinned location at ``commit_id``."""
    return {
        entry["path"]: store.pinned_location(commit_id, prefix + entry["path"]).uri
        for split in manifest["splits"].values()
        for entry in split["shards"]
    }


def read_pinned_shards(store: VersionedStore, commit_id: str, manifest_path: str) -> PinnedShards:
    """The manifest at ``commit_id`` and where each of its shards lies at that commit."""
    manifest = json.loads(store.get_object(commit_id, manifest_path))
    prefix = manifest_path.rsplit("/", 1)[0] + "/"
    return PinnedShards(
        commit_id=commit_id, manifest_path=manifest_path, manifest=manifest,
        locations=_shard_locations(store, commit_id, prefix, manifest),
        s3_endpoint_url=store.pinned_location(commit_id, manifest_path).s3_endpoint_url)
