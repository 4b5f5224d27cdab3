"""Locating and verifying shard files: local paths, or s3:// objects downloaded into a content-addressed
cache, each checked against the manifest's size and sha256 before anything reads it."""

from __future__ import annotations

import hashlib
import os
import urllib.parse
from pathlib import Path

from training_runtime.atomic_files import atomic_path


class DataError(RuntimeError):
    """A shard is missing, corrupt or unreadable; the message names the shard and the fix."""


# ---------------------------------------------------------------- shard access
def sha256_file(path: str | os.PathLike, chunk: int = 8 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _fetch_s3(url: str, dest: Path, endpoint_url: str | None) -> None:
    import boto3  # only needed for s3:// locations

    parsed = urllib.parse.urlparse(url)
    client = boto3.client("s3", endpoint_url=endpoint_url)
    try:
        client.download_file(parsed.netloc, parsed.path.lstrip("/"), str(dest))
    except Exception as e:
        dest.unlink(missing_ok=True)
        raise DataError(f"cannot download shard {url} (endpoint {endpoint_url}): {e}; check the "
                        "URL in data.locations, data.s3_endpoint_url and the AWS_* credentials") from e


def _download_to_cache(url: str, local: Path, shard: dict, endpoint_url: str | None) -> None:
    """Fetch a shard into the cache under its final name only once it is whole, checked and on
    disk: a shard cut short by a crash or a failed check never looks cached."""
    with atomic_path(local) as tmp:
        _fetch_s3(url, tmp, endpoint_url)
        _check_shard(tmp, shard, url)


def _check_shard(local: Path, shard: dict, url: str) -> None:
    size = local.stat().st_size
    if size != shard["num_bytes"]:
        raise DataError(f"shard {shard['path']!r} at {url} has {size} bytes, manifest says "
                        f"{shard['num_bytes']}; the shard does not belong to this manifest")
    digest = sha256_file(local)
    if digest != shard["sha256"]:
        raise DataError(f"checksum mismatch for shard {shard['path']!r} at {url}: sha256 "
                        f"{digest} != manifest {shard['sha256']}; the shard is corrupt or from "
                        "another commit; re-materialize the shards")


def resolve_shards(manifest: dict, locations: dict[str, str], split: str, cache_dir: str | None,
                   s3_endpoint_url: str | None = None, verify: bool = True) -> list[Path]:
    """Local paths of the split's shards. s3:// shards are downloaded into ``cache_dir`` as
    ``<sha256>.bin`` and enter the cache only after their size and sha256 match the manifest;
    with ``verify`` every shard (cached or file://) is checked again. Raises ``DataError`` naming
    the shard."""
    if split not in manifest["splits"]:
        raise DataError(f"manifest has no split {split!r}; it has {sorted(manifest['splits'])}")
    paths = []
    for shard in manifest["splits"][split]["shards"]:
        url = locations.get(shard["path"])
        if url is None:
            raise DataError(f"data.locations has no entry for shard {shard['path']!r}")
        if url.startswith("file://"):
            local = Path(urllib.parse.unquote(urllib.parse.urlparse(url).path))
            if not local.is_file():
                raise DataError(f"shard {shard['path']!r} is missing: {local} does not exist; "
                                f"re-materialize the shards or fix data.locations")
            if verify:
                _check_shard(local, shard, url)
        elif url.startswith("s3://"):
            if cache_dir is None:
                raise DataError("data.cache_dir is required for s3:// shards")
            os.makedirs(cache_dir, exist_ok=True)
            local = Path(cache_dir) / f"{shard['sha256']}.bin"
            if not local.is_file():
                _download_to_cache(url, local, shard, s3_endpoint_url)
            elif verify:
                try:
                    _check_shard(local, shard, url)
                except DataError:
                    local.unlink(missing_ok=True)  # a corrupt cached copy is fetched again next time
                    raise
        else:
            raise DataError(f"unsupported location {url!r} for shard {shard['path']!r}")
        paths.append(local)
    return paths
