"""lakeFS's versioning semantics, held in memory: the model behind tests/support/lakefs_server.py.

Written from lakeFS's own source (treeverse/lakeFS at 332d1e28, the commit that released the
python wrapper 0.16.0), not from the platform's idea of lakeFS: this is what the platform's
lakeFS backend is tested against, so it must not share the platform's code or assumptions.
Each rule names the lakeFS file it comes from. What it leaves out (hooks, branch protection,
garbage collection, imports, pre-signed URLs, ref expressions such as ``main~1``) is listed in
docs/lakefs-and-s3.md.

Object bytes live in files under a directory (one file per upload, like lakeFS's physical
addresses); everything else is in memory. Errors are ``LakeFSError(status, message)`` with the
HTTP status lakeFS's controller answers for the same graveler error (pkg/api/controller.go,
``handleApiErrorCallback``).
"""

from __future__ import annotations

import hashlib
import heapq
import re
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

INITIAL_COMMIT_MESSAGE = "Repository created"  # pkg/graveler/graveler.go FirstCommitMsg
MERGE_STRATEGY_KEY = ".lakefs.merge.strategy"  # pkg/graveler/graveler.go MergeStrategyMetadataKey
MERGE_STRATEGIES = {"": "default", "dest-wins": "dest-wins", "source-wins": "source-wins"}
DEFAULT_CONTENT_TYPE = "application/octet-stream"  # pkg/catalog/model.go DefaultContentType
MAX_PATH_BYTES = 1024  # pkg/catalog/validate.go MaxPathLength
MAX_DELETE_PATHS = 1000  # pkg/api/controller.go DefaultMaxDeleteObjects
NAMESPACE_REGEX = re.compile(r"^local://")  # pkg/block/namespace.go DefaultValidationRegex("local")

# pkg/validator/validate.go. Go's \w and \s are ASCII-only.
REPOSITORY_ID = re.compile(r"^[a-z0-9][a-z0-9-]{2,62}$")
BRANCH_ID = re.compile(r"^[A-Za-z0-9_][-A-Za-z0-9_]*$")
REF = re.compile(r"^[^\t\n\f\r ]+$")
FULL_COMMIT_ID = re.compile(r"^[a-fA-F0-9]{64}$")  # pkg/graveler/ref/resolve_ref.go
COMMIT_PREFIX = re.compile(r"^[a-fA-F0-9]{1,64}$")


class LakeFSError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def valid_tag_id(tag: str) -> bool:
    """pkg/graveler/validate.go ValidateTagID: git's check-ref-format rules, '~' allowed."""
    return bool(tag) and tag != "@" and not tag.endswith((".", ".lock")) \
        and not any(s in tag for s in ("..", "/", "@{")) \
        and not any(c in tag for c in "^:?*[\\") and all(ord(c) > 0x20 for c in tag)


def _require(ok: bool, status: int, message: str) -> None:
    if not ok:
        raise LakeFSError(status, message)


@dataclass(frozen=True)
class Entry:
    """An object version. Equality is lakeFS's value identity (pkg/catalog/entry.go
    EntryToValue): size, ETag, user metadata and content type, and nothing else. The physical
    address and mtime are not part of it, so the same bytes uploaded again (a new address, a new
    mtime) are no change: the uncommitted diff skips them (graveler/uncommitted_diff_iterator.go),
    a commit keeps the committed record and answers "no changes" (committed/commit.go), and a
    merge takes either side without a conflict (committed/merge.go)."""

    address: str = field(compare=False)
    checksum: str  # MD5 hex, the ETag lakeFS's local blockstore returns
    size: int
    mtime: int = field(compare=False)
    content_type: str
    metadata: tuple[tuple[str, str], ...] = ()


Tree = dict[str, Entry]


@dataclass(frozen=True)
class Commit:
    id: str
    parents: tuple[str, ...]
    committer: str
    message: str
    metadata: dict[str, str]
    creation_ns: int
    tree: Tree = field(repr=False, compare=False)
    meta_range_id: str
    generation: int


@dataclass
class Branch:
    head: str
    staging: dict[str, Entry | None] = field(default_factory=dict)  # None: a tombstone
    hidden: bool = False


@dataclass
class Repository:
    id: str
    storage_namespace: str
    default_branch: str
    creation_date: int
    commits: dict[str, Commit] = field(default_factory=dict)
    branches: dict[str, Branch] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)


def meta_range_id(tree: Tree) -> str:
    """A content address of the tree. Only the first commit has none (""): an emptied tree is
    written as a meta range of its own, so merging it is not "no changes" (committed/manager.go).
    lakeFS's ranges hold each record's data, physical address and mtime included, so those are
    hashed too; commits and merges keep the committed record of an unchanged object, so an
    unchanged tree keeps its id."""
    h = hashlib.sha256()
    for path in sorted(tree):
        e = tree[path]
        h.update(repr((path, e.address, e.checksum, e.size, e.mtime, e.content_type, e.metadata)).encode())
    return h.hexdigest()


def listing(rows: list[tuple[str, object]], prefix: str, delimiter: str) -> list[tuple[str, object | None]]:
    """Rows under ``prefix``, with everything past the next ``delimiter`` folded into one common
    prefix row (value None), sorted by path (pkg/catalog/entry_listing_iterator.go)."""
    out: dict[str, object | None] = {}
    for path, value in rows:
        if not path.startswith(prefix):
            continue
        rest = path[len(prefix):]
        if delimiter and delimiter in rest:
            out[prefix + rest[:rest.index(delimiter) + len(delimiter)]] = None
        else:
            out[path] = value
    return sorted(out.items())


def page(rows: list, key, after: str, amount: int) -> tuple[list, bool]:
    """lakeFS listings: items strictly after ``after``, at most ``amount``, and whether more exist."""
    rest = [r for r in rows if key(r) > after] if after else rows
    return rest[:amount], len(rest) > amount


class LakeFSModel:
    """Repositories with branches, staging areas, commits, tags, merges, as lakeFS keeps them."""

    def __init__(self, blob_dir: Path):
        self.blob_dir = Path(blob_dir)
        self.blob_dir.mkdir(parents=True, exist_ok=True)
        self.repositories: dict[str, Repository] = {}
        # lakeFS refuses a namespace that already holds a repository's data, deleted or not
        # (pkg/api/controller.go ensureStorageNamespace: "already in use").
        self.used_namespaces: set[str] = set()
        self.lock = threading.RLock()
        self._last_ns = 0

    def _now_ns(self) -> int:
        # Log order is by creation time (pkg/graveler/ref/commit_iterator.go); keep it strict.
        self._last_ns = max(time.time_ns(), self._last_ns + 1)
        return self._last_ns

    # --- blobs ------------------------------------------------------------------------------
    def write_blob(self, repo_id: str, stream, content_type: str, metadata: dict[str, str]) -> Entry:
        """Store the bytes of one upload under a fresh physical address (outside the lock)."""
        with self.lock:
            namespace = self.repo(repo_id).storage_namespace
        name = uuid.uuid4().hex
        md5, size = hashlib.md5(), 0
        with open(self.blob_dir / name, "wb") as f:
            while chunk := stream.read(1 << 20):
                md5.update(chunk)
                size += len(chunk)
                f.write(chunk)
        return Entry(address=f"{namespace.rstrip('/')}/data/{name}", checksum=md5.hexdigest(), size=size,
                     mtime=int(time.time()), content_type=content_type or DEFAULT_CONTENT_TYPE,
                     metadata=tuple(sorted(metadata.items())))

    def blob_file(self, entry: Entry) -> Path:
        return self.blob_dir / entry.address.rsplit("/", 1)[-1]

    # --- repositories (pkg/api/controller.go CreateRepository) ---------------------------------
    def create_repository(self, name: str, namespace: str, default_branch: str, storage_id: str) -> Repository:
        _require(bool(REPOSITORY_ID.fullmatch(name or "")), 400,
                 "argument repository: repository id: invalid value: validation error")
        with self.lock:
            _require(name not in self.repositories, 409, "error creating repository: not unique")
            _require(storage_id == "", 400, "storage id: invalid value: validation error")
            _require(bool(NAMESPACE_REGEX.match(namespace or "")), 400,
                     f"failed to match required regex {NAMESPACE_REGEX.pattern}: invalid namespace")
            _require(namespace not in self.used_namespaces, 400,
                     f"failed to create repository: found lakeFS objects in the storage namespace ({namespace}): "
                     "storage namespace already in use")
            default_branch = default_branch or "main"
            _require(bool(BRANCH_ID.fullmatch(default_branch)), 400, "argument branch: branch id: invalid value")
            repo = Repository(name, namespace, default_branch, int(time.time()))
            first = self._add_commit(repo, (), "", INITIAL_COMMIT_MESSAGE, {}, {}, generation=1, first=True)
            repo.branches[default_branch] = Branch(first.id)
            self.repositories[name] = repo
            self.used_namespaces.add(namespace)
            return repo

    def repo(self, name: str) -> Repository:
        repo = self.repositories.get(name)
        _require(repo is not None, 404, "repository not found")
        return repo

    def delete_repository(self, name: str) -> None:
        with self.lock:
            self.repo(name)
            del self.repositories[name]

    # --- refs (pkg/graveler/ref/resolve_ref.go: full commit id, branch, tag, commit prefix) ----
    def resolve(self, repo: Repository, ref: str) -> str:
        _require(bool(REF.fullmatch(ref or "")), 400, "ref: invalid value: validation error")
        if FULL_COMMIT_ID.fullmatch(ref) and ref in repo.commits:
            return ref
        if ref in repo.branches:
            return repo.branches[ref].head
        if ref in repo.tags:
            return repo.tags[ref]
        if COMMIT_PREFIX.fullmatch(ref):
            matches = [c for c in repo.commits if c.startswith(ref.lower())]
            if len(matches) == 1:
                return matches[0]
        hint = " (the test server does not evaluate ref expressions such as main~1)" \
            if any(c in ref for c in "~^@$") else ""
        raise LakeFSError(404, f"ref {ref}: not found{hint}")

    def view(self, repo: Repository, ref: str) -> Tree:
        """What reading ``ref`` sees: a branch includes its staging area."""
        branch = repo.branches.get(ref)
        if branch is None or (FULL_COMMIT_ID.fullmatch(ref) and ref in repo.commits):
            return repo.commits[self.resolve(repo, ref)].tree
        tree = dict(repo.commits[branch.head].tree)
        for path, entry in branch.staging.items():
            if entry is None:
                tree.pop(path, None)
            else:
                tree[path] = entry
        return tree

    def entry(self, repo: Repository, ref: str, path: str) -> Entry:
        _require(bool(path), 400, "argument path: required value")
        branch = None if FULL_COMMIT_ID.fullmatch(ref) and ref in repo.commits else repo.branches.get(ref)
        if branch is not None and path in branch.staging:
            found = branch.staging[path]  # staged (None: deleted), without building the whole view
        else:
            found = repo.commits[self.resolve(repo, ref)].tree.get(path)
        _require(found is not None, 404, "not found")
        return found

    def branch(self, repo: Repository, name: str) -> Branch:
        # Every branch operation validates the id first (pkg/catalog/catalog.go): 400, not 404.
        _require(bool(BRANCH_ID.fullmatch(name)), 400, "argument branch: branch id: invalid value: validation error")
        found = repo.branches.get(name)
        _require(found is not None, 404, f"branch '{name}' not found")
        return found

    def is_dirty(self, repo: Repository, name: str) -> bool:
        """pkg/graveler/graveler.go isUncommittedEmpty: any effective uncommitted change."""
        return self.view(repo, name) != repo.commits[repo.branches[name].head].tree

    # --- branches (pkg/catalog/catalog.go CreateBranch, pkg/graveler/graveler.go) ------------
    def create_branch(self, repo: Repository, name: str, source: str, hidden: bool) -> str:
        _require(bool(BRANCH_ID.fullmatch(name or "")), 400,
                 "argument branch: branch id: invalid value: branch id must consist of letters, digits, "
                 "underscores and dashes, and cannot start with a dash")
        _require(name not in repo.commits, 409, f"commit ID {name}: conflict found")
        _require(name not in repo.tags, 409, f"tag ID {name}: conflict found")
        head = self.resolve(repo, source)
        _require(name not in repo.branches, 409, "branch already exists: not unique")
        repo.branches[name] = Branch(head, hidden=hidden)
        return head

    def delete_branch(self, repo: Repository, name: str) -> None:
        _require(name != repo.default_branch, 403, "cannot delete repository default branch")
        self.branch(repo, name)
        del repo.branches[name]

    def reset(self, repo: Repository, name: str, kind: str, path: str) -> None:
        """pkg/api/controller.go ResetBranch: drop staged changes of one object, a prefix, or all."""
        branch = self.branch(repo, name)
        if kind == "reset":
            branch.staging.clear()
        elif kind == "object":
            branch.staging.pop(path, None)
        elif kind == "common_prefix":
            for staged in [p for p in branch.staging if p.startswith(path)]:
                del branch.staging[staged]
        else:
            raise LakeFSError(400, "unknown reset type")

    # --- objects ------------------------------------------------------------------------------
    def stage(self, repo: Repository, name: str, path: str, entry: Entry, if_none_match: bool) -> None:
        branch = self.branch(repo, name)
        _require(bool(path), 400, "argument path: required value")
        _require(len(path.encode()) <= MAX_PATH_BYTES, 400, f"{len(path.encode())} is above maximum length")
        # pkg/api/apiutil/conditions.go: If-None-Match: * fails when the path exists.
        _require(not (if_none_match and path in self.view(repo, name)), 412, "path already exists")
        branch.staging[path] = entry

    def delete_object(self, repo: Repository, name: str, path: str) -> None:
        """pkg/graveler/graveler.go deleteUnsafe: a path that is nowhere is not an error."""
        branch = self.branch(repo, name)
        _require(bool(path), 400, "argument path: required value")
        if path in repo.commits[branch.head].tree:
            branch.staging[path] = None
        else:
            branch.staging.pop(path, None)

    # --- history --------------------------------------------------------------------------------
    def _add_commit(self, repo: Repository, parents: tuple[str, ...], committer: str, message: str,
                    metadata: dict[str, str], tree: Tree, generation: int, first: bool = False) -> Commit:
        created = self._now_ns()
        mr = "" if first else meta_range_id(tree)
        cid = hashlib.sha256(repr((repo.id, parents, committer, message, sorted(metadata.items()), created, mr))
                             .encode()).hexdigest()
        commit = Commit(cid, parents, committer, message, dict(metadata), created, tree, mr, generation)
        repo.commits[cid] = commit
        return commit

    def commit(self, repo: Repository, name: str, committer: str, message: str, metadata: dict[str, str],
               allow_empty: bool) -> Commit:
        """pkg/graveler/graveler.go Commit: "no changes" unless allow_empty. A staged object of
        the same identity as the committed one (the same bytes uploaded again) leaves the
        committed record, its address and mtime, in the tree (committed/commit.go applyNextKey)."""
        branch = self.branch(repo, name)
        parent = repo.commits[branch.head]
        tree = {path: parent.tree[path] if parent.tree.get(path) == entry else entry
                for path, entry in self.view(repo, name).items()}
        _require(tree != parent.tree or allow_empty, 400, "commit: no changes")
        commit = self._add_commit(repo, (parent.id,), committer, message, metadata, tree, parent.generation + 1)
        branch.head, branch.staging = commit.id, {}
        return commit

    def log(self, repo: Repository, ref: str, after: str, amount: int, limit: bool) -> tuple[list[Commit], bool]:
        """pkg/catalog/catalog.go ListCommits: newest first by creation time (then id); skip to
        ``after``; collect ``amount`` (``limit``) or ``amount + 1`` commits, and there are more
        only when ``amount + 1`` were found. So ``limit=true`` always answers has_more=false."""
        start = self.resolve(repo, ref)
        after_id = self.resolve(repo, after) if after else ""
        queue = [self._log_key(repo.commits[start])]
        seen = {start}
        found: list[Commit] = []
        skipping = bool(after_id)
        while queue and len(found) < (amount if limit else amount + 1):
            commit = repo.commits[heapq.heappop(queue)[1]]
            for parent in commit.parents:
                if parent not in seen:
                    seen.add(parent)
                    heapq.heappush(queue, self._log_key(repo.commits[parent]))
            if skipping:
                skipping = commit.id != after_id
                continue
            found.append(commit)
        return found[:amount], len(found) > amount

    @staticmethod
    def _log_key(commit: Commit) -> tuple[int, str]:
        # Newest first (commit_iterator.go Less). lakeFS breaks ties of equal times by commit id;
        # here creation times are unique (_now_ns), so there are none.
        return (-commit.creation_ns, commit.id)

    def merge_base(self, repo: Repository, left: str, right: str) -> Commit | None:
        """pkg/graveler/ref/merge_base_finder.go FindMergeBase, step by step."""
        if left == right:
            return repo.commits[left]
        reached = {left: 1, right: 2}
        queue = [(-repo.commits[c].generation, -repo.commits[c].creation_ns, c) for c in (left, right)]
        heapq.heapify(queue)
        while queue:
            commit = repo.commits[heapq.heappop(queue)[2]]
            for parent in commit.parents:
                if parent not in reached:
                    p = repo.commits[parent]
                    heapq.heappush(queue, (-p.generation, -p.creation_ns, parent))
                reached[parent] = reached.get(parent, 0) | reached[commit.id]
                if reached[parent] == 3:
                    return repo.commits[parent]
        return None

    @staticmethod
    def three_way(dest: Tree, source: Tree, base: Tree, strategy: str) -> tuple[Tree, list[str]]:
        """pkg/graveler/committed/merge.go: take each side's change; both changed differently is a
        conflict, unless a strategy picks a side. Sides compare by identity (Entry's equality):
        both sides holding the same identity write the source's record (merger.handleBothKeys)."""
        merged, conflicts = dict(dest), []
        for path in sorted(set(dest) | set(source) | set(base)):
            d, s, b = dest.get(path), source.get(path), base.get(path)
            if d == s:
                if s is not None:
                    merged[path] = s
                continue
            if s == b:
                continue
            if d == b or strategy == "source-wins":
                if s is None:
                    merged.pop(path, None)
                else:
                    merged[path] = s
            elif strategy != "dest-wins":
                conflicts.append(path)
        return merged, conflicts

    def merge(self, repo: Repository, source_ref: str, dest: str, committer: str, message: str,
              metadata: dict[str, str], strategy: str, allow_empty: bool, squash: bool) -> Commit:
        """pkg/graveler/graveler.go Merge and pkg/graveler/committed/manager.go Merge."""
        _require(strategy in MERGE_STRATEGIES, 400, "invalid merge strategy")
        branch = self.branch(repo, dest)
        source = repo.commits[self.resolve(repo, source_ref)]
        _require(not self.is_dirty(repo, dest), 400, f"{dest}: uncommitted changes (dirty branch)")
        target = repo.commits[branch.head]
        base = self.merge_base(repo, source.id, target.id)
        _require(base is not None, 400, "no merge base")
        # "no changes" compares trees (meta ranges), not commits.
        _require(source.meta_range_id != base.meta_range_id or allow_empty, 400, "merge: no changes")
        if target.meta_range_id == base.meta_range_id:
            tree = source.tree
        else:
            tree, conflicts = self.three_way(target.tree, source.tree, base.tree, strategy)
            _require(not conflicts, 409, "conflict found")
        commit = self._add_commit(
            repo, (target.id,) if squash else (target.id, source.id), committer,
            message or f"Merge '{source_ref}' into '{dest}'",
            {**metadata, MERGE_STRATEGY_KEY: MERGE_STRATEGIES[strategy]}, tree,
            max(target.generation, source.generation) + 1)
        branch.head = commit.id
        return commit

    def _parent(self, repo: Repository, commit: Commit, parent_number: int | None, action: str) -> Tree:
        """The tree of the parent a revert or cherry-pick is relative to (graveler.go Revert,
        CherryPick): a merge commit needs a 1-based parent number."""
        if len(commit.parents) > 1 and not parent_number:
            raise LakeFSError(409 if action == "reverting" else 400,
                              f"must specify 1-based parent number for {action} merge commit")
        number = parent_number or 1
        out_of_range = (parent_number or action == "cherry-picking") and number > len(commit.parents)
        _require(not out_of_range, 400, "given commit does not have the given parent number")
        return repo.commits[commit.parents[number - 1]].tree if commit.parents else {}

    def revert(self, repo: Repository, name: str, ref: str, parent_number: int | None, committer: str,
               allow_empty: bool, message: str | None, metadata: dict[str, str] | None) -> Commit:
        """pkg/graveler/graveler.go Revert: merge the commit's parent onto the branch with the
        commit itself as base; message "Revert <ref>" (pkg/catalog/catalog.go Revert)."""
        branch = self.branch(repo, name)
        target = repo.commits[self.resolve(repo, ref)]
        parent_tree = self._parent(repo, target, parent_number, "reverting")
        _require(not self.is_dirty(repo, name), 400, f"{name}: uncommitted changes (dirty branch)")
        head = repo.commits[branch.head]
        tree, conflicts = self.three_way(head.tree, parent_tree, target.tree, "")
        _require(not conflicts, 409, "conflict found")
        _require(meta_range_id(tree) != head.meta_range_id or allow_empty, 400, "no changes")
        commit = self._add_commit(repo, (head.id,), committer, message or f"Revert {ref}",
                                  metadata if metadata is not None else {}, tree, head.generation + 1)
        branch.head = commit.id
        return commit

    def cherry_pick(self, repo: Repository, name: str, ref: str, parent_number: int | None, committer: str,
                    message: str | None, metadata: dict[str, str] | None) -> Commit:
        """pkg/graveler/graveler.go CherryPick: apply the commit's change; keep its message and
        metadata, adding cherry-pick-origin and cherry-pick-committer."""
        branch = self.branch(repo, name)
        picked = repo.commits[self.resolve(repo, ref)]
        parent_tree = self._parent(repo, picked, parent_number, "cherry-picking")
        _require(not self.is_dirty(repo, name), 400, f"{name}: uncommitted changes (dirty branch)")
        head = repo.commits[branch.head]
        tree, conflicts = self.three_way(head.tree, picked.tree, parent_tree, "")
        _require(not conflicts, 409, "conflict found")
        meta = dict(metadata if metadata is not None else picked.metadata)
        meta.update({"cherry-pick-origin": picked.id, "cherry-pick-committer": picked.committer})
        commit = self._add_commit(repo, (head.id,), committer, message or picked.message, meta, tree,
                                  head.generation + 1)
        branch.head = commit.id
        return commit

    # --- diffs ------------------------------------------------------------------------------------
    @staticmethod
    def two_dot(left: Tree, right: Tree) -> list[tuple[str, str, Entry | None]]:
        """What changes from ``left`` to ``right``: (path, type, the entry that describes it)."""
        out = []
        for path in sorted(set(left) | set(right)):
            lv, rv = left.get(path), right.get(path)
            if lv != rv:
                kind = "added" if lv is None else "removed" if rv is None else "changed"
                out.append((path, kind, rv or lv))
        return out

    def three_dot(self, repo: Repository, left_ref: str, right_ref: str) -> list[tuple[str, str, Entry | None]]:
        """pkg/graveler/committed/compare_iterator.go: what ``right`` changed since the merge
        base; a path both sides changed differently is a "conflict"."""
        left = repo.commits[self.resolve(repo, left_ref)]
        right = repo.commits[self.resolve(repo, right_ref)]
        base = self.merge_base(repo, right.id, left.id)
        _require(base is not None, 400, "no merge base")
        out = []
        for path, kind, entry in self.two_dot(left.tree, right.tree):
            b, d = base.tree.get(path), left.tree.get(path)
            if right.tree.get(path) == b:
                continue  # only the left side changed it
            out.append((path, kind if d == b else "conflict", entry))
        return out

    def uncommitted(self, repo: Repository, name: str) -> list[tuple[str, str, Entry | None]]:
        branch = self.branch(repo, name)
        rows = self.two_dot(repo.commits[branch.head].tree, self.view(repo, name))
        # A removal's size is 0: its value is the tombstone (pkg/api/controller.go DiffBranch).
        return [(p, k, None if k == "removed" else e) for p, k, e in rows]

    # --- tags (pkg/catalog/catalog.go CreateTag) ------------------------------------------------
    def create_tag(self, repo: Repository, tag: str, ref: str) -> str:
        _require(valid_tag_id(tag), 400, "argument tagID: tag id: invalid value: validation error")
        _require(tag not in repo.branches, 409, f"branch name {tag}: conflict found")
        _require(tag not in repo.commits, 409, f"commit ID {tag}: conflict found")
        commit_id = self.resolve(repo, ref)
        _require(tag not in repo.tags, 409, "tag already exists: not unique")
        repo.tags[tag] = commit_id
        return commit_id

    def tag(self, repo: Repository, tag: str) -> str:
        _require(valid_tag_id(tag), 400, "argument tagID: tag id: invalid value: validation error")
        _require(tag in repo.tags, 404, "tag not found")
        return repo.tags[tag]

    def delete_tag(self, repo: Repository, tag: str) -> None:
        self.tag(repo, tag)
        del repo.tags[tag]

    def copy(self, repo_id: str, dest_branch: str, dest_path: str, src_ref: str, src_path: str) -> Entry:
        """pkg/api/controller.go CopyObject and pkg/catalog/catalog.go CopyEntry (a full copy):
        the destination must be a branch (checked first: a tag or commit id is 404 "branch '<id>'
        not found"), the source is read at ``src_ref`` (the destination branch when empty), and
        the blockstore copies its bytes to a new physical address, so none are served. The copy
        keeps the checksum, size, content type and user metadata, with a new mtime. Takes the
        lock itself, as write_blob does: the blob is copied outside it (blobs never change)."""
        with self.lock:
            repo = self.repo(repo_id)
            self.branch(repo, dest_branch)
            source = self.entry(repo, src_ref or dest_branch, src_path)
            namespace = repo.storage_namespace
        name = uuid.uuid4().hex
        shutil.copyfile(self.blob_file(source), self.blob_dir / name)
        copied = replace(source, address=f"{namespace.rstrip('/')}/data/{name}", mtime=int(time.time()))
        with self.lock:
            # lakeFS's CreateEntry: the branch may have gone while the bytes were copied.
            self.stage(self.repo(repo_id), dest_branch, dest_path, copied, if_none_match=False)
        return copied
