"""What the pipeline needs from a versioned dataset store, modelled on lakeFS.

Semantics every implementation must keep (the behaviour suite in tests/store checks them):
- a repository has a default branch ``main``;
- commit ids are immutable; a ref is a branch name, a tag or a commit id;
- writes go to a branch's uncommitted staging area, visible only through that branch until
  committed; another branch never sees them;
- ``merge`` is atomic: the destination either moves to the merge commit or is untouched;
  a merge whose two sides changed the same path differently raises ``MergeConflictError``;
- tags are immutable pointers to commits;
- ``read_range`` reads bytes as a file's pread does (clipped at the end, empty past it), so a
  reader such as pyarrow fetches only the byte ranges it seeks to (``open_object``).
"""

from __future__ import annotations

import io
import re
import tempfile
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

MAIN = "main"

# lakeFS's own id rules (treeverse/lakeFS pkg/validator/validate.go ReValidBranchID, and
# pkg/graveler/validate.go ValidateBranchID / ValidateTagID). Go's \w is ASCII only.
_BRANCH_ID = re.compile(r"^[A-Za-z0-9_][-A-Za-z0-9_]*$")
_TAG_FORBIDDEN = ("..", "/", "@{", "^", ":", "?", "*", "[", "\\")
# The platform's own bound, not lakeFS's: the local twin keeps each branch and tag in a file
# named after it, written through a temporary ".<name>.json.<12 hex>.tmp", and file names are
# at most 255 bytes.
MAX_REF_BYTES = 200
# Object paths: relative, '/'-separated, no '..', no empty or '.' components, no control chars.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class StoreError(Exception):
    """Any failure of the versioned store, with a message that says what to do."""


class RefNotFoundError(StoreError):
    """A branch, tag, commit or object that does not exist."""


class MergeConflictError(StoreError):
    """Both sides of a merge changed the same paths; the destination was left untouched."""

    def __init__(self, message: str, paths: list[str] | None = None):
        super().__init__(message)
        self.paths = paths or []


@dataclass(frozen=True)
class Commit:
    id: str
    message: str
    metadata: dict[str, str]
    parents: tuple[str, ...]
    creation_date: float  # seconds since the epoch


@dataclass(frozen=True)
class ObjectInfo:
    path: str
    size_bytes: int
    checksum: str  # content hash as the backend reports it (sha256 locally, etag on lakeFS)


@dataclass(frozen=True)
class StoreUser:
    """The user a store authenticated its credentials as (lakeFS), for the audit trail."""

    id: str
    detail: str  # how it was established, in words (never a secret)


@dataclass(frozen=True)
class DiffEntry:
    path: str
    type: str  # "added" | "removed" | "changed"


def is_branch_id(name: str) -> bool:
    """lakeFS ValidateBranchID: a letter, digit or '_', then letters, digits, '_' and '-'."""
    return bool(_BRANCH_ID.fullmatch(name))


def is_tag_id(name: str) -> bool:
    """lakeFS ValidateTagID (git's check-ref-format, '~' allowed): not empty or '@'; no '..',
    '/', '@{', '^', ':', '?', '*', '[', '\\', spaces or control characters; not ending in
    '.' or '.lock'. So release tags such as ``v1.0.0`` are fine."""
    return bool(name) and name != "@" and not name.endswith((".", ".lock")) \
        and not any(part in name for part in _TAG_FORBIDDEN) and all(ord(c) > 0x20 for c in name)


def validate_ref_name(name: str, what: str = "branch") -> str:
    """Refuse names lakeFS would refuse, with a message naming the rule.

    ``what`` says which rule: "branch" (lakeFS's branch ids), "tag" (its tag ids), anything
    else ("ref", "commit id") a name that can be a branch, a tag or a commit id (commit ids
    are hex, so branch ids). Beyond lakeFS, every name is at most MAX_REF_BYTES bytes, and a
    tag does not start with '.', which the local twin keeps for its temporary files.
    """
    if not isinstance(name, str) or not name:
        raise StoreError(f"invalid {what} name {name!r}: it is empty")
    if len(name.encode()) > MAX_REF_BYTES:
        raise StoreError(f"invalid {what} name {name[:40]!r}...: longer than {MAX_REF_BYTES} bytes")
    branch_rule = "letters, digits, '_' and '-', starting with a letter, digit or '_'"
    tag_rule = ("a name without spaces, control characters, '..', '/', '@{', '^', ':', '?', '*', '[' or '\\', not '@', "
                "not starting with '.' and not ending in '.' or '.lock'")
    if what == "branch":
        ok, rule = is_branch_id(name), branch_rule
    elif what == "tag":
        ok, rule = is_tag_id(name) and not name.startswith("."), tag_rule
    else:
        ok, rule = is_branch_id(name) or (is_tag_id(name) and not name.startswith(".")), \
            f"a branch name ({branch_rule}) or a tag name ({tag_rule})"
    if not ok:
        raise StoreError(f"invalid {what} name {name!r}: use {rule}")
    return name


def validate_object_path(path: str) -> str:
    """Refuse object paths that could escape a directory or that lakeFS cannot store."""
    if not isinstance(path, str) or not path:
        raise StoreError("invalid object path: it is empty; give a relative path such as 'raw/data.parquet'")
    if len(path.encode()) > 1024:
        raise StoreError(f"invalid object path {path[:40]!r}...: longer than 1024 bytes")
    if _CONTROL.search(path):
        raise StoreError(f"invalid object path {path!r}: it contains control characters")
    if path.startswith("/") or "\\" in path:
        raise StoreError(f"invalid object path {path!r}: it must be relative and use '/' separators")
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise StoreError(f"invalid object path {path!r}: empty, '.' or '..' components are not allowed")
    return path


# lakeFS repository id rule: 3-63 lowercase letters, digits and dashes, starting with a letter
# or digit.
_REPOSITORY_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{2,62}$")


def validate_repository_name(name: str) -> str:
    """Refuse repository names lakeFS would refuse, with a message naming the rule."""
    if not isinstance(name, str) or not _REPOSITORY_NAME.fullmatch(name):
        raise StoreError(
            f"invalid repository name {name!r}: use 3-63 lowercase letters, digits and '-', "
            "starting with a letter or digit"
        )
    return name


def validate_metadata(metadata: dict[str, str] | None) -> dict[str, str]:
    """Commit metadata is string -> string on every backend (lakeFS stores only strings)."""
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise StoreError(f"commit metadata must be a dict of strings, got {type(metadata).__name__}")
    bad = {k: type(v).__name__ for k, v in metadata.items() if not isinstance(k, str) or not isinstance(v, str)}
    if bad:
        raise StoreError(
            "commit metadata values must be strings; convert these first (e.g. json.dumps or str): "
            + ", ".join(f"{k!r} ({t})" for k, t in sorted(bad.items(), key=lambda kv: str(kv[0])))
        )
    return dict(metadata)


def check_range(path: str, start: int, length: int) -> None:
    """Refuse a range no object has, naming it (``read_range``'s arguments)."""
    if not isinstance(start, int) or not isinstance(length, int) or start < 0 or length < 0:
        raise StoreError(f"read_range({path!r}, start={start!r}, length={length!r}): start and length must be "
                         "whole numbers of bytes, 0 or more")


class RangedObject(io.RawIOBase):
    """One store object as a read-only, seekable binary file that reads only what is asked.

    Each ``read`` is one ``read_range`` of exactly the bytes asked for (clipped at the end), so
    the bytes fetched (``bytes_fetched``, ``requests``) are what the reader needed, and a
    failure is retried by the store per request. No read-ahead: Parquet readers already read
    whole column chunks (or, with ``pre_buffer=True``, a row group's chunks coalesced into one
    range), and a block-aligned read-ahead would fetch neighbouring row groups a step does not
    need. What was fetched is kept, up to ``cache_bytes`` (least recently used first out), and a
    read inside a kept range costs no request: Parquet reads the last 64 KiB for the footer and
    then reads the metadata and the last row group again from inside it.
    """

    def __init__(self, store: VersionedStore, ref: str, path: str, *, cache_bytes: int = 16 << 20):
        super().__init__()
        self.store, self.ref, self.path = store, ref, path
        self.name = path  # what error messages (and pyarrow) call the file
        self._size = store.stat_object(ref, path).size_bytes
        self._pos = 0
        self._cache: OrderedDict[int, bytes] = OrderedDict()
        self._cache_bytes = cache_bytes
        self._lock = threading.Lock()  # one reader thread may prefetch while another reads
        self.bytes_fetched = 0
        self.requests = 0

    def __repr__(self) -> str:
        return f"RangedObject({self.path!r} at {self.ref!r}, {self._size} bytes)"

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def size(self) -> int:
        return self._size

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError(f"seek to {base + offset} in {self.path}: before the start")
        self._pos = base + offset
        return self._pos

    def read(self, size: int = -1) -> bytes:
        if self.closed:
            raise ValueError(f"read of {self.path} after it was closed")
        start = self._pos
        end = self._size if size is None or size < 0 else min(self._size, start + size)
        data = self.pread(start, end - start) if end > start else b""
        self._pos = start + len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        memoryview(buffer).cast("B")[:len(data)] = data
        return len(data)

    def pread(self, start: int, length: int) -> bytes:
        """``length`` bytes from ``start`` (clipped at the end), from what is kept or one request."""
        with self._lock:
            for at, data in self._cache.items():
                if at <= start and start + length <= at + len(data):
                    self._cache.move_to_end(at)
                    return data[start - at:start - at + length]
            data = self.store.read_range(self.ref, self.path, start, length)
            if len(data) != min(length, max(0, self._size - start)):
                raise StoreError(f"read {self.path!r} at {self.ref!r}: got {len(data)} byte(s) for {length} from "
                                 f"{start} of {self._size}; the object changed while read: read it at a commit id")
            self.requests += 1
            self.bytes_fetched += len(data)
            if len(data) <= self._cache_bytes:
                self._cache[start] = data
                while sum(map(len, self._cache.values())) > self._cache_bytes:
                    self._cache.popitem(last=False)
            return data


@dataclass
class StoreLocation:
    """Where a worker can read one object at a pinned commit, without the store's client."""

    uri: str  # file:///abs/path or s3://bucket/key
    s3_endpoint_url: str | None = None
    extra: dict[str, str] = field(default_factory=dict)


class VersionedStore(ABC):
    """A lakeFS-like repository of objects with branches, commits, merges and tags."""

    repository: str

    # --- repository and refs -------------------------------------------------------------
    @abstractmethod
    def ensure_repository(self) -> None:
        """Create the repository with an empty ``main`` if it does not exist yet."""

    @abstractmethod
    def create_branch(self, name: str, source_ref: str = MAIN, exist_ok: bool = False) -> str:
        """Create branch ``name`` at ``source_ref``; return its head commit id."""

    @abstractmethod
    def delete_branch(self, name: str) -> None: ...

    @abstractmethod
    def list_branches(self) -> dict[str, str]:
        """Branch name -> head commit id."""

    @abstractmethod
    def resolve_ref(self, ref: str) -> str:
        """Branch, tag or commit id -> commit id. Raises RefNotFoundError."""

    @abstractmethod
    def get_commit(self, ref: str) -> Commit: ...

    @abstractmethod
    def log(self, ref: str, limit: int = 100) -> list[Commit]:
        """Commits reachable from ``ref``, newest first."""

    # --- objects ---------------------------------------------------------------------------
    @abstractmethod
    def put_object(self, branch: str, path: str, data: bytes) -> None:
        """Stage ``data`` at ``path`` on ``branch`` (uncommitted)."""

    @abstractmethod
    def put_file(self, branch: str, path: str, local_path: Path) -> None:
        """Stage a local file at ``path`` on ``branch`` without reading it all into memory."""

    @abstractmethod
    def delete_object(self, branch: str, path: str) -> None: ...

    @abstractmethod
    def get_object(self, ref: str, path: str) -> bytes:
        """Read ``path`` at ``ref`` (a branch includes its uncommitted writes)."""

    @abstractmethod
    def download(self, ref: str, path: str, dest: Path) -> Path:
        """Copy ``path`` at ``ref`` to the local file ``dest`` (streamed)."""

    @abstractmethod
    def stat_object(self, ref: str, path: str) -> ObjectInfo:
        """``path``'s size and checksum at ``ref``. Raises RefNotFoundError."""

    @abstractmethod
    def read_range(self, ref: str, path: str, start: int, length: int) -> bytes:
        """Bytes ``start`` to ``start + length`` of ``path`` at ``ref``, as a file's pread gives
        them: clipped at the object's end, so fewer when the range runs past it and ``b""`` when
        ``start`` is at or past it or ``length`` is 0. A missing object or ref raises
        RefNotFoundError even then; a negative ``start`` or ``length`` raises StoreError."""

    def copy_object(self, src_ref: str, src_path: str, dest_branch: str, dest_path: str | None = None) -> ObjectInfo:
        """Stage at ``dest_path`` (``src_path`` when None) on ``dest_branch`` the object ``src_path``
        at ``src_ref`` (a branch includes its uncommitted writes), uncommitted, as ``put_file`` of
        its bytes would; return the copy's ObjectInfo (same size and checksum). The copy is an
        object of its own: a later write or delete at either path leaves the other as it was.

        A store that copies on its side (lakeFS, and the local store, which shares the immutable
        blob) moves no bytes through this process: that is what makes carrying a terabyte raw copy
        from one run's branch to another cheap. This default, for a store that cannot, streams
        the bytes through a temporary file, never all in memory. Raises RefNotFoundError for a
        missing source, and for a destination that is not a branch (a tag or a commit id: lakeFS
        writes to branches only)."""
        dest_path = src_path if dest_path is None else dest_path
        validate_ref_name(src_ref, "ref")
        validate_ref_name(dest_branch, "branch")
        validate_object_path(src_path)
        validate_object_path(dest_path)
        with tempfile.TemporaryDirectory(prefix="store-copy-") as tmp:
            local = self.download(src_ref, src_path, Path(tmp) / "object")
            self.put_file(dest_branch, dest_path, local)
        return self.stat_object(dest_branch, dest_path)

    def open_object(self, ref: str, path: str, *, cache_bytes: int = 16 << 20) -> RangedObject:
        """A read-only, seekable file over ``path`` at ``ref`` that fetches only the byte ranges
        read (``read_range``), for readers such as ``pyarrow.parquet.ParquetFile`` that seek to
        what they need. Give a commit id: at a branch a concurrent write could change the
        object between two reads."""
        return RangedObject(self, ref, path, cache_bytes=cache_bytes)

    @abstractmethod
    def list_objects(self, ref: str, prefix: str = "") -> list[ObjectInfo]:
        """Objects under ``prefix`` at ``ref``, sorted by path."""

    def exists(self, ref: str, path: str) -> bool:
        return any(o.path == path for o in self.list_objects(ref, prefix=path))

    @abstractmethod
    def has_uncommitted_changes(self, branch: str) -> bool: ...

    # --- history ---------------------------------------------------------------------------
    @abstractmethod
    def commit(
        self, branch: str, message: str, metadata: dict[str, str] | None = None,
        allow_empty: bool = False,
    ) -> Commit:
        """Commit the branch's staged changes. Metadata values must be strings.

        Like lakeFS, a commit without changes raises StoreError unless ``allow_empty``.
        """

    @abstractmethod
    def merge(
        self, source_ref: str, destination_branch: str, message: str | None = None,
        metadata: dict[str, str] | None = None,
    ) -> str:
        """Merge ``source_ref`` into ``destination_branch`` atomically; return the new head.

        Fast-forwards when the destination is an ancestor of the source and there is no
        message or metadata to record (local backend; lakeFS always records a merge commit):
        either way the source commit is reachable from the new head. Merging a source that is
        already contained returns the current head. Raises MergeConflictError (destination
        untouched, ``.paths`` lists the paths) when both sides changed the same paths, and
        StoreError when the destination has uncommitted changes.
        """

    @abstractmethod
    def create_tag(self, tag: str, ref: str) -> str:
        """Tag the commit ``ref`` resolves to; raises StoreError if the tag exists."""

    @abstractmethod
    def list_tags(self) -> dict[str, str]:
        """Tag -> commit id."""

    @abstractmethod
    def delete_tag(self, tag: str) -> None: ...

    @abstractmethod
    def diff(self, left_ref: str, right_ref: str, prefix: str = "") -> list[DiffEntry]:
        """What changed going from ``left_ref`` to ``right_ref`` (committed state), by path."""

    # --- reading outside the store client ----------------------------------------------------
    @abstractmethod
    def pinned_location(self, commit_id: str, path: str) -> StoreLocation:
        """A location a training worker reads ``path`` from at the immutable ``commit_id``."""

    def ui_link(self, ref: str) -> str | None:
        """A link to ``ref`` in the backend's web UI, if it has one."""
        return None

    def describe(self) -> dict[str, str]:
        """Non-secret facts about this backend for lineage records."""
        return {"backend": type(self).__name__, "repository": self.repository}

    def authenticated_user(self) -> StoreUser | None:
        """The user the store authenticated this client's credentials as; None for a store that
        authenticates nobody (a local directory)."""
        return None
