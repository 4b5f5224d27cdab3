"""The embedded versioned store: a directory that behaves like a lakeFS repository.

Layout under ``<root>/<repository>/``::

    objects/ab/cdef…      content, named by sha256, written once, read-only
    trees/<id>.json       {path: [sha256, size]}; id = sha256 of the canonical JSON
    commits/<id>.json     {tree, parents, message, metadata, time, generation}; id = sha256
    branches/<name>.json  {"head": commit id, "staged": {path: [sha256, size] | null}}
    tags/<name>           commit id
    lock                  fcntl lock taken for every ref or staging update

Objects, trees and commits are immutable and written before anything points at them; a
branch file is replaced by one atomic rename, so a reader never sees a half-applied commit
or merge, and readers need no lock.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import BinaryIO

from resources.store.atomic_files import atomic_copy_file, copy_stream_hashing, file_lock
from resources.store.base import (
    MAIN,
    Commit,
    DiffEntry,
    MergeConflictError,
    ObjectInfo,
    RefNotFoundError,
    StoreError,
    StoreLocation,
    VersionedStore,
    check_range,
    validate_metadata,
    validate_object_path,
    validate_ref_name,
    validate_repository_name,
)
from resources.store.three_way import diff_trees, merge_base, merge_trees
from training_runtime.atomic_files import atomic_write_bytes, fsync_path, replace_durably

Tree = dict[str, tuple[str, int]]
INITIAL_COMMIT_MESSAGE = "Repository created"


def _canonical(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


class LocalVersionedStore(VersionedStore):
    """A lakeFS-like repository in a local directory, safe for concurrent processes."""

    def __init__(self, root: Path, repository: str):
        self.root = Path(root).absolute()
        self.repository = validate_repository_name(repository)
        self.repo_dir = self.root / repository
        self._read_tree = lru_cache(maxsize=64)(self._read_tree_uncached)

    def __reduce__(self):
        # Rebuilt from its two settings (the tree cache is per process), e.g. for worker processes.
        return (type(self), (self.root, self.repository))

    def __repr__(self) -> str:
        return f"LocalVersionedStore(root={str(self.root)!r}, repository={self.repository!r})"

    def describe(self) -> dict[str, str]:
        return {"backend": "local", "repository": self.repository, "root": str(self.root)}

    # --- paths ---------------------------------------------------------------------------------
    def _object_file(self, sha: str) -> Path:
        return self.repo_dir / "objects" / sha[:2] / sha[2:]

    def _branch_file(self, name: str) -> Path:
        return self.repo_dir / "branches" / f"{name}.json"

    def _tag_file(self, name: str) -> Path:
        return self.repo_dir / "tags" / name

    def _commit_file(self, commit_id: str) -> Path:
        return self.repo_dir / "commits" / f"{commit_id}.json"

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self._require_repository()
        with file_lock(self.repo_dir / "lock"):
            yield

    def _require_repository(self) -> None:
        if not (self.repo_dir / "repository.json").exists():
            raise RefNotFoundError(
                f"repository {self.repository!r} does not exist under {self.root}; "
                "call ensure_repository() first"
            )

    # --- repository and refs -----------------------------------------------------------------
    def ensure_repository(self) -> None:
        self.repo_dir.mkdir(parents=True, exist_ok=True)
        with file_lock(self.repo_dir / "lock"):
            marker = self.repo_dir / "repository.json"
            if marker.exists():
                return
            for sub in ("objects", "trees", "commits", "branches", "tags"):
                (self.repo_dir / sub).mkdir(exist_ok=True)
            initial = self._write_commit({}, (), INITIAL_COMMIT_MESSAGE, {})
            self._write_branch(MAIN, initial.id, {})
            # Written last: a repository exists only once main exists.
            atomic_write_bytes(marker, _canonical({"name": self.repository, "default_branch": MAIN}))

    def create_branch(self, name: str, source_ref: str = MAIN, exist_ok: bool = False) -> str:
        validate_ref_name(name, "branch")
        with self._locked():
            existing = self._read_branch_or_none(name)
            if existing is not None:
                if exist_ok:
                    return existing["head"]
                raise StoreError(
                    f"branch {name!r} already exists in repository {self.repository!r}; "
                    "pick another name or pass exist_ok=True"
                )
            if self._tag_file(name).exists():
                raise StoreError(f"cannot create branch {name!r}: a tag has that name; pick another name")
            head = self.resolve_ref(source_ref)
            self._write_branch(name, head, {})
            return head

    def delete_branch(self, name: str) -> None:
        validate_ref_name(name, "branch")
        if name == MAIN:
            raise StoreError(f"refusing to delete the default branch {MAIN!r}")
        with self._locked():
            path = self._branch_file(name)
            if not path.exists():
                raise RefNotFoundError(f"branch {name!r} not found in repository {self.repository!r}")
            path.unlink()
            fsync_path(path.parent)  # the deletion reaches the disk with the directory

    def list_branches(self) -> dict[str, str]:
        self._require_repository()
        out = {}
        for path in sorted((self.repo_dir / "branches").glob("*.json")):
            out[path.stem] = json.loads(path.read_bytes())["head"]
        return out

    def resolve_ref(self, ref: str) -> str:
        validate_ref_name(ref, "ref")
        self._require_repository()
        branch = self._read_branch_or_none(ref)
        if branch is not None:
            return branch["head"]
        tag = self._tag_file(ref)
        if tag.exists():
            return tag.read_text().strip()
        if self._commit_file(ref).exists():
            return ref
        raise RefNotFoundError(
            f"ref {ref!r} is not a branch, tag or commit id in repository {self.repository!r}; "
            f"branches: {sorted(self.list_branches())}"
        )

    def get_commit(self, ref: str) -> Commit:
        commit_id = self.resolve_ref(ref)
        return self._to_commit(commit_id, self._read_commit(commit_id))

    def log(self, ref: str, limit: int = 100) -> list[Commit]:
        start = self.resolve_ref(ref)
        # Newest first; generation keeps every child ahead of its parents even when clocks tie.
        frontier = {start: self._read_commit(start)}
        seen = {start}
        out: list[Commit] = []
        while frontier and len(out) < limit:
            cid = max(frontier, key=lambda c: (frontier[c]["generation"], frontier[c]["time"], c))
            record = frontier.pop(cid)
            out.append(self._to_commit(cid, record))
            for parent in record["parents"]:
                if parent not in seen:
                    seen.add(parent)
                    frontier[parent] = self._read_commit(parent)
        return out

    # --- objects -------------------------------------------------------------------------------
    def put_object(self, branch: str, path: str, data: bytes) -> None:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise StoreError(f"put_object({path!r}) needs bytes, got {type(data).__name__}; encode text first")
        self._stage_stream(branch, path, io.BytesIO(bytes(data)))

    def put_file(self, branch: str, path: str, local_path: Path) -> None:
        local_path = Path(local_path)
        if not local_path.is_file():
            raise StoreError(f"put_file: {local_path} is not a readable file")
        with open(local_path, "rb") as f:
            self._stage_stream(branch, path, f)

    def _stage_stream(self, branch: str, path: str, stream: BinaryIO) -> None:
        validate_ref_name(branch, "branch")
        validate_object_path(path)
        self._require_repository()
        self._require_branch(branch)
        sha, size = self._store_blob(stream)
        self._stage(branch, path, (sha, size))

    def _store_blob(self, stream: BinaryIO) -> tuple[str, int]:
        tmp, sha, size = copy_stream_hashing(stream, self.repo_dir / "objects" / "incoming")
        final = self._object_file(sha)
        if final.exists():
            tmp.unlink()  # same content already stored once
            return sha, size
        final.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(tmp, 0o444)  # content-addressed objects never change
        replace_durably(tmp, final)
        return sha, size

    def _stage(self, branch: str, path: str, entry: tuple[str, int] | None) -> None:
        with self._locked():
            state = self._require_branch(branch)
            state["staged"][path] = list(entry) if entry else None
            self._write_branch(branch, state["head"], state["staged"])

    def delete_object(self, branch: str, path: str) -> None:
        validate_ref_name(branch, "branch")
        validate_object_path(path)
        with self._locked():
            state = self._require_branch(branch)
            if path not in self._branch_tree(state):
                raise RefNotFoundError(f"object {path!r} not found on branch {branch!r}")
            head_tree = self._commit_tree(state["head"])
            if path in head_tree:
                state["staged"][path] = None
            else:
                state["staged"].pop(path, None)  # only ever staged: forget it
            self._write_branch(branch, state["head"], state["staged"])

    def _entry(self, ref: str, path: str) -> tuple[str, int]:
        validate_object_path(path)
        entry = self._tree_at(ref).get(path)
        if entry is None:
            raise RefNotFoundError(f"object {path!r} not found at ref {ref!r} in repository {self.repository!r}")
        return entry

    def copy_object(self, src_ref: str, src_path: str, dest_branch: str, dest_path: str | None = None) -> ObjectInfo:
        """The destination is staged with the source's blob: blobs are named by their content and
        never rewritten (a write stores a new blob and points the path at it), so sharing one
        moves no bytes and a later write to either path cannot change the other."""
        dest_path = src_path if dest_path is None else dest_path
        validate_ref_name(dest_branch, "branch")
        validate_object_path(dest_path)
        with self._locked():
            # The destination first, as lakeFS checks it: a tag or commit id is no branch.
            state = self._read_branch_or_none(dest_branch)
            if state is None:
                raise RefNotFoundError(
                    f"copy of {src_path!r} to {dest_branch!r}: {dest_branch!r} is not a branch of repository "
                    f"{self.repository!r}; copies are staged on a branch (not a tag or commit id): name one of "
                    f"{sorted(self.list_branches())} or create it with create_branch({dest_branch!r})")
            sha, size = self._entry(src_ref, src_path)
            state["staged"][dest_path] = [sha, size]
            self._write_branch(dest_branch, state["head"], state["staged"])
        return ObjectInfo(path=dest_path, size_bytes=size, checksum=sha)

    def get_object(self, ref: str, path: str) -> bytes:
        sha, _ = self._entry(ref, path)
        return self._object_file(sha).read_bytes()

    def download(self, ref: str, path: str, dest: Path) -> Path:
        sha, _ = self._entry(ref, path)
        return atomic_copy_file(self._object_file(sha), Path(dest))

    def stat_object(self, ref: str, path: str) -> ObjectInfo:
        sha, size = self._entry(ref, path)
        return ObjectInfo(path=path, size_bytes=size, checksum=sha)

    def read_range(self, ref: str, path: str, start: int, length: int) -> bytes:
        check_range(path, start, length)
        sha, _ = self._entry(ref, path)
        # Blobs are named by their content and never rewritten: a slice of the file is the object's.
        with open(self._object_file(sha), "rb") as f:
            f.seek(start)
            return f.read(length)

    def list_objects(self, ref: str, prefix: str = "") -> list[ObjectInfo]:
        tree = self._tree_at(ref)
        return [
            ObjectInfo(path=p, size_bytes=size, checksum=sha)
            for p, (sha, size) in sorted(tree.items()) if p.startswith(prefix)
        ]

    def has_uncommitted_changes(self, branch: str) -> bool:
        validate_ref_name(branch, "branch")
        self._require_repository()
        state = self._require_branch(branch)
        return self._branch_tree(state) != self._commit_tree(state["head"])

    # --- history -------------------------------------------------------------------------------
    def commit(
        self, branch: str, message: str, metadata: dict[str, str] | None = None,
        allow_empty: bool = False,
    ) -> Commit:
        validate_ref_name(branch, "branch")
        metadata = validate_metadata(metadata)
        if not isinstance(message, str) or not message.strip():
            raise StoreError("commit message is empty; say what the commit holds")
        with self._locked():
            state = self._require_branch(branch)
            tree = self._branch_tree(state)
            if tree == self._commit_tree(state["head"]) and not allow_empty:
                raise StoreError(
                    f"nothing to commit on branch {branch!r}: no uncommitted changes "
                    "(pass allow_empty=True to record an empty commit)"
                )
            commit = self._write_commit(tree, (state["head"],), message, metadata)
            self._write_branch(branch, commit.id, {})
            return commit

    def merge(
        self, source_ref: str, destination_branch: str, message: str | None = None,
        metadata: dict[str, str] | None = None,
    ) -> str:
        validate_ref_name(destination_branch, "branch")
        metadata = validate_metadata(metadata)
        with self._locked():
            # Everything below runs under the repository lock: the destination cannot move
            # between reading its head and replacing it.
            source = self.resolve_ref(source_ref)
            dest_state = self._require_branch(destination_branch)
            dest = dest_state["head"]
            if self._branch_tree(dest_state) != self._commit_tree(dest):
                raise StoreError(
                    f"cannot merge into {destination_branch!r}: it has uncommitted changes; "
                    "commit or discard them first"
                )
            base = merge_base(dest, source, self._parents, self._generation)
            if base == source:
                return dest  # source already contained: nothing to do
            if base == dest and not metadata and message is None:
                self._write_branch(destination_branch, source, {})
                return source
            merged, conflicts = merge_trees(
                self._commit_tree(base) if base else {},
                self._commit_tree(dest), self._commit_tree(source),
            )
            if conflicts:
                raise MergeConflictError(
                    f"merging {source_ref!r} into {destination_branch!r} conflicts on "
                    f"{len(conflicts)} path(s): {conflicts[:20]}; {destination_branch!r} is "
                    "unchanged. Resolve by changing those paths on one side and merge again.",
                    paths=conflicts,
                )
            text = message or f"Merge {source_ref!r} into {destination_branch!r}"
            commit = self._write_commit(merged, (dest, source), text, metadata)
            self._write_branch(destination_branch, commit.id, {})
            return commit.id

    def create_tag(self, tag: str, ref: str) -> str:
        validate_ref_name(tag, "tag")
        with self._locked():
            commit_id = self.resolve_ref(ref)
            path = self._tag_file(tag)
            if path.exists():
                raise StoreError(
                    f"tag {tag!r} already exists (at {path.read_text().strip()}); tags are "
                    "immutable, pick a new name"
                )
            if self._branch_file(tag).exists():
                raise StoreError(f"cannot create tag {tag!r}: a branch has that name; pick another name")
            atomic_write_bytes(path, commit_id.encode())
            return commit_id

    def list_tags(self) -> dict[str, str]:
        self._require_repository()
        return {p.name: p.read_text().strip() for p in sorted((self.repo_dir / "tags").iterdir())
                if not p.name.startswith(".")}

    def delete_tag(self, tag: str) -> None:
        validate_ref_name(tag, "tag")
        with self._locked():
            path = self._tag_file(tag)
            if not path.exists():
                raise RefNotFoundError(f"tag {tag!r} not found in repository {self.repository!r}")
            path.unlink()
            fsync_path(path.parent)  # the deletion reaches the disk with the directory

    def diff(self, left_ref: str, right_ref: str, prefix: str = "") -> list[DiffEntry]:
        left = self._commit_tree(self.resolve_ref(left_ref))
        right = self._commit_tree(self.resolve_ref(right_ref))
        return [DiffEntry(path=p, type=t) for p, t in diff_trees(left, right, prefix)]

    def compare(self, left_ref: str, right_ref: str, prefix: str = "") -> list[DiffEntry]:
        """lakeFS's three-dot diff: what ``right_ref`` changed since its merge base with
        ``left_ref``; paths that ``left_ref`` changed differently are marked "conflict"."""
        left, right = self.resolve_ref(left_ref), self.resolve_ref(right_ref)
        base = merge_base(left, right, self._parents, self._generation)
        base_tree = self._commit_tree(base) if base else {}
        left_tree, right_tree = self._commit_tree(left), self._commit_tree(right)
        out = []
        for path, kind in diff_trees(base_tree, right_tree, prefix):
            theirs = left_tree.get(path)
            if theirs != base_tree.get(path) and theirs != right_tree.get(path):
                kind = "conflict"
            out.append(DiffEntry(path=path, type=kind))
        return out

    def uncommitted_diff(self, branch: str, prefix: str = "") -> list[DiffEntry]:
        """What the branch's staging area changes relative to its head commit."""
        validate_ref_name(branch, "branch")
        self._require_repository()
        state = self._require_branch(branch)
        changes = diff_trees(self._commit_tree(state["head"]), self._branch_tree(state), prefix)
        return [DiffEntry(path=p, type=t) for p, t in changes]

    # --- reading outside the store client --------------------------------------------------------
    def pinned_location(self, commit_id: str, path: str) -> StoreLocation:
        validate_ref_name(commit_id, "commit id")
        if self._read_branch_or_none(commit_id) is not None:
            raise StoreError(
                f"pinned_location needs a commit id or tag, not the moving branch {commit_id!r}; "
                "pass store.resolve_ref(branch)"
            )
        resolved = self.resolve_ref(commit_id)
        sha, size = self._entry(resolved, path)
        return StoreLocation(
            uri=self._object_file(sha).as_uri(),
            extra={"commit_id": resolved, "path": path, "sha256": sha, "size_bytes": str(size)},
        )

    # --- internals -----------------------------------------------------------------------------
    def _read_branch_or_none(self, name: str) -> dict | None:
        try:
            state = json.loads(self._branch_file(name).read_bytes())
        except FileNotFoundError:
            return None
        state["staged"] = {p: (tuple(e) if e else None) for p, e in state["staged"].items()}
        return state

    def _require_branch(self, name: str) -> dict:
        state = self._read_branch_or_none(name)
        if state is None:
            raise RefNotFoundError(
                f"branch {name!r} not found in repository {self.repository!r}; "
                f"create it with create_branch({name!r})"
            )
        return state

    def _write_branch(self, name: str, head: str, staged: dict) -> None:
        staged = {p: (list(e) if e else None) for p, e in staged.items()}
        atomic_write_bytes(self._branch_file(name), _canonical({"head": head, "staged": staged}))

    def _branch_tree(self, state: dict) -> Tree:
        tree = dict(self._commit_tree(state["head"]))
        for path, entry in state["staged"].items():
            if entry is None:
                tree.pop(path, None)
            else:
                tree[path] = tuple(entry)
        return tree

    def _tree_at(self, ref: str) -> Tree:
        """A branch's tree includes its staging area; tags and commits are committed state."""
        validate_ref_name(ref, "ref")
        self._require_repository()
        state = self._read_branch_or_none(ref)
        if state is not None:
            return self._branch_tree(state)
        return self._commit_tree(self.resolve_ref(ref))

    def _read_commit(self, commit_id: str) -> dict:
        try:
            return json.loads(self._commit_file(commit_id).read_bytes())
        except FileNotFoundError:
            raise RefNotFoundError(
                f"commit {commit_id!r} not found in repository {self.repository!r}"
            ) from None

    def _parents(self, commit_id: str) -> tuple[str, ...]:
        return tuple(self._read_commit(commit_id)["parents"])

    def _generation(self, commit_id: str) -> int:
        return self._read_commit(commit_id)["generation"]

    def _commit_tree(self, commit_id: str) -> Tree:
        return self._read_tree(self._read_commit(commit_id)["tree"])

    def _read_tree_uncached(self, tree_id: str) -> Tree:
        raw = json.loads((self.repo_dir / "trees" / f"{tree_id}.json").read_bytes())
        return {p: (e[0], e[1]) for p, e in raw.items()}

    def _write_commit(self, tree: Tree, parents: tuple[str, ...], message: str,
                      metadata: dict[str, str]) -> Commit:
        tree_bytes = _canonical({p: list(e) for p, e in sorted(tree.items())})
        tree_id = hashlib.sha256(tree_bytes).hexdigest()
        tree_file = self.repo_dir / "trees" / f"{tree_id}.json"
        if not tree_file.exists():
            atomic_write_bytes(tree_file, tree_bytes)
        generation = 1 + max((self._generation(p) for p in parents), default=0)
        record = {
            "tree": tree_id, "parents": list(parents), "message": message,
            "metadata": dict(metadata), "time": time.time(), "generation": generation,
        }
        record_bytes = _canonical(record)
        commit_id = hashlib.sha256(record_bytes).hexdigest()
        atomic_write_bytes(self._commit_file(commit_id), record_bytes)
        return self._to_commit(commit_id, record)

    @staticmethod
    def _to_commit(commit_id: str, record: dict) -> Commit:
        return Commit(
            id=commit_id, message=record["message"], metadata=dict(record["metadata"]),
            parents=tuple(record["parents"]), creation_date=float(record["time"]),
        )

    def object_file(self, commit_id: str, path: str) -> Path:
        """The read-only content file behind ``path`` at ``commit_id`` (for servers over this store)."""
        sha, _ = self._entry(commit_id, path)
        return self._object_file(sha)

    def delete_repository(self) -> None:
        """Remove the whole repository directory (tests and teardown)."""
        with self._locked():
            shutil.rmtree(self.repo_dir)
