"""What each of the platform's S3 keys is granted, so a refusal can name the missing permission.

The S3 server enforces the grants (IAM policies on AWS, the identity configuration on SeaweedFS,
helm/README.md "Storage keys"); a ``KeyScope`` only describes them, for error messages. Two keys:

- the **training key** (training pods): reads the shards, writes only its run's checkpoint prefix
  ``<artifact prefix>/models/<model>/checkpoints/<run id>/``;
- the **orchestrator key** (code location, run and step pods): reads, lists and writes what it
  publishes under the artifact prefix (weights, TensorBoard events, rank logs) and deletes there
  (housekeeping).

Locations are ``bucket/prefix/`` strings; a prefix of ``""`` is the whole bucket.
"""

from __future__ import annotations

from dataclasses import dataclass

READ, WRITE, LIST = "read", "write", "list"


@dataclass(frozen=True)
class KeyScope:
    role: str  # how the key is called in messages: "training key", "orchestrator key"
    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    list: tuple[str, ...] = ()

    def granted(self, permission: str) -> tuple[str, ...]:
        if permission not in (READ, WRITE, LIST):
            raise ValueError(f"unknown permission {permission!r}; use read, write or list")
        return getattr(self, permission)

    def allows(self, permission: str, bucket: str, key: str) -> bool:
        target = f"{bucket}/{key}"
        return any(target.startswith(location) for location in self.granted(permission))

    def explain(self, permission: str) -> str:
        """``the training key may write only under s3://b/p/`` (or: has no write grant at all)."""
        where = self.granted(permission)
        if not where:
            return f"the {self.role} has no {permission} grant at all"
        return f"the {self.role} may {permission} only under " + ", ".join(f"s3://{w}" for w in where)


def _location(bucket: str, *parts: str) -> str:
    path = "/".join(p.strip("/") for p in parts if p.strip("/"))
    return f"{bucket}/{path}/" if path else f"{bucket}/"


def checkpoint_location(bucket: str, prefix: str, model: str, run_id: str) -> str:
    """A run's checkpoint prefix, where the training op also publishes its weights (ops/training.py)."""
    return _location(bucket, prefix, "models", model, "checkpoints", run_id)


def training_scope(bucket: str, prefix: str, model: str, run_id: str, shards: tuple[str, ...]) -> KeyScope:
    """A training pod's key: read and list the shard locations, write its run's checkpoints."""
    checkpoints = checkpoint_location(bucket, prefix, model, run_id)
    return KeyScope("training key", read=(*shards, checkpoints), write=(checkpoints,), list=(*shards, checkpoints))


def orchestrator_scope(bucket: str, prefix: str) -> KeyScope:
    """The orchestrator's key: everything under the artifact prefix it publishes to."""
    artifacts = _location(bucket, prefix)
    return KeyScope("orchestrator key", read=(artifacts,), write=(artifacts,), list=(artifacts,))
