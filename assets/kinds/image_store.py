"""An image folder's parts in the versioned store: what a new version takes from the previous
one, and what its commit adds and removes (assets/kinds/image_parts.py says what a part is).

The run's branch starts from ``main``, which holds the newest version, so the parts and shards a
new version keeps are already on it: they are neither uploaded nor rewritten, and the commit
touches only the parts that changed. A kept file the branch lacks (a branch made another way) is
copied by the store from the previous version's commit, so the version is whole either way.
"""

from __future__ import annotations

import json
from pathlib import Path

from assets.kinds.image_ingest import PreviousParts
from assets.kinds.image_parts import INDEX_NAME, RAW_DIR, ROWS_DIR, read_index
from assets.kinds.image_shards import CARRIED
from resources.store.base import RefNotFoundError

OLD_RAW = "images.parquet"


def previous_parts(store, commit: str | None, raw_prefix: str, tmp: Path) -> PreviousParts | None:
    """The parts of the version at ``commit`` (None: no version to build on, or one made before
    parts, whose raw copy has no index)."""
    if commit is None:
        return None
    try:
        found = read_index(store.get_object(commit, raw_prefix + INDEX_NAME))
    except RefNotFoundError:
        return None

    def rows(part: dict) -> Path:
        return store.download(commit, raw_prefix + part["rows_table"], tmp / "previous" / part["rows_table"])

    return PreviousParts(parts={p["key"]: p for p in found["parts"]}, rows=rows)


def put_raw(store, branch: str, raw_prefix: str, out: Path, previous_commit: str | None,
            staged: dict[str, str] | None = None) -> dict:
    """Make ``raw_prefix`` on the branch hold exactly the parts the index under ``out`` lists: the
    new ones uploaded (or, ``staged``, path -> branch, put on a branch by an ingest step: left
    there, or copied from an earlier attempt's branch), the kept ones left (or copied from
    ``previous_commit``), the others removed. Returns counts for the log."""
    parts = read_index((out / INDEX_NAME).read_bytes())["parts"]
    wanted = {raw_prefix + p[k] for p in parts for k in ("raw", "rows_table")}
    # the raw copy of a version made before parts (one images.parquet) goes too
    return _sync(store, branch, raw_prefix, out, wanted, previous_commit, (RAW_DIR + "/", ROWS_DIR + "/", OLD_RAW),
                 index=(raw_prefix + INDEX_NAME, (out / INDEX_NAME).read_bytes()), staged=staged)


def unstage(store, branch: str, staged: dict[str, str]) -> int:
    """Take off ``branch`` the files ingest steps staged on it (a failed report commits only its
    evidence, as a run in one step does). Returns how many."""
    mine = [path for path, where in sorted(staged.items()) if where == branch and store.exists(branch, path)]
    for path in mine:
        store.delete_object(branch, path)
    return len(mine)


def fetch_raw(store, commit: str, raw_prefix: str, dest: Path, previous_manifest: dict | None) -> Path:
    """The raw copy at ``commit`` under ``dest`` as ``shard_images`` reads it: the index, and the
    parts whose shards ``previous_manifest`` does not already hold (only those are sharded)."""
    dest.mkdir(parents=True, exist_ok=True)
    data = store.get_object(commit, raw_prefix + INDEX_NAME)
    (dest / INDEX_NAME).write_bytes(data)
    kept = {p["key"] for p in (previous_manifest or {}).get("parts", [])}
    for part in read_index(data)["parts"]:
        if part["key"] not in kept:
            store.download(commit, raw_prefix + part["raw"], dest / part["raw"])
    return dest


def put_shards(store, branch: str, prefix: str, out: Path, manifest: dict, previous_commit: str | None,
               staged: dict[str, str] | None = None) -> dict:
    """``prefix`` on the branch holds exactly the manifest's shards and files: carried shards stay
    (or are copied), the new ones are uploaded, the rest are removed; then the manifest, without
    the carried marks. ``staged``: shards a step already put on a branch (path -> that branch),
    copied from there when it is not this one (a step of an earlier attempt of the run). Returns
    counts for the log."""
    wanted = {prefix + e["path"] for split in manifest["splits"].values() for e in split["shards"]}
    wanted |= {prefix + rel for rel in manifest.get("files", [])}
    carried = {prefix + e["path"] for split in manifest["splits"].values() for e in split["shards"] if e.get(CARRIED)}
    published = strip_carried(manifest)
    return _sync(store, branch, prefix, out, wanted, previous_commit, ("",), carried=carried, staged=staged,
                 index=(prefix + "manifest.json", json.dumps(published, indent=2, sort_keys=True).encode()))


def strip_carried(manifest: dict) -> dict:
    """The manifest as published: a shard entry does not say which version first made it."""
    return {**manifest, "splits": {s: {**info, "shards": [{k: v for k, v in e.items() if k != CARRIED}
                                                          for e in info["shards"]]}
                                   for s, info in manifest["splits"].items()}}


def _sync(store, branch: str, prefix: str, out: Path, wanted: set[str], previous_commit: str | None,
          managed: tuple[str, ...], *, index: tuple[str, bytes], carried: set[str] | None = None,
          staged: dict[str, str] | None = None) -> dict:
    """Upload what ``out`` holds of ``wanted``, keep what the branch has, copy what neither has
    from ``previous_commit``, and delete the managed paths under ``prefix`` that are not wanted."""
    present = {o.path for o in store.list_objects(branch, prefix=prefix)}
    counts = {"uploaded": 0, "kept": 0, "copied": 0, "removed": 0}
    for path in sorted(present - wanted - {index[0]}):
        if path[len(prefix):].startswith(managed):
            store.delete_object(branch, path)
            counts["removed"] += 1
    for path in sorted(wanted):
        local = out / path[len(prefix):]
        if (carried is None or path not in carried) and local.is_file():
            store.put_file(branch, path, local)
            counts["uploaded"] += 1
        elif path in present:
            counts["kept"] += 1
        elif (source := (staged or {}).get(path) or previous_commit) is not None:
            # by the store: a raw part can be hundreds of MB, and none of it passes through here
            store.copy_object(source, path, branch)
            counts["copied"] += 1
        else:
            raise FileNotFoundError(f"{path}: neither made by this run nor held by the branch or a previous version")
    store.put_object(branch, index[0], index[1])
    return counts


def parts_line(dataset: str, parts: dict, previous_tag: str | None, moved: dict) -> str:
    """What the raw copy of a new version cost, for the run's log."""
    total = parts["new"] + parts["reused"]
    if previous_tag is None or not parts["reused"]:
        return f"{dataset}: the raw copy in {total} part(s), all made by this run"
    return (f"{dataset}: {parts['new']} of {total} part(s) changed and were ingested; {parts['reused']} part(s) "
            f"({parts['reused_rows']} images) are {previous_tag}'s, kept as they are, not read or decoded again "
            f"({moved['uploaded']} file(s) written, {moved['removed']} removed)")
