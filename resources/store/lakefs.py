"""The versioned store on lakeFS, through the maintained SDK (``lakefs-sdk``, the layer the
``lakefs`` package is built on; never the deprecated ``lakefs-client``).

Not the ``lakefs`` wrapper itself: what this backend needs (every request's attempts counted
and reconciled on the SDK's ApiException status, uploads streamed from a file with their
length, one retry loop) the wrapper would hide behind its own exceptions, and its writer
buffers up to 32 MB in memory before sending chunked. So the wrapper is only a dev
dependency, for lakeFS's own tests in tests/store/lakefs_conformance.

The SDK's HTTP client is used with urllib3's own retries off, so every request is attempted
exactly as often as ``max_attempts`` says: transient failures (HTTP 5xx/429, connection
refused or reset, read timeouts) are retried here with exponential backoff and jitter, then
reported as a StoreError that names the endpoint and what to check. Writes whose first attempt
may have been applied before the failure (a timeout after sending) are reconciled on retry,
so a retried commit, merge, branch or tag never fails just because the first try succeeded.

The secret key lives only inside the SDK's configuration; it is never part of repr, messages,
logs or ``describe()``.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, urlencode

import lakefs_sdk
import urllib3
from lakefs_sdk.client import LakeFSClient
from lakefs_sdk.exceptions import ApiException

from resources.store.base import (
    MAIN,
    Commit,
    DiffEntry,
    MergeConflictError,
    ObjectInfo,
    RefNotFoundError,
    StoreError,
    StoreLocation,
    StoreUser,
    VersionedStore,
    check_range,
    is_branch_id,
    validate_metadata,
    validate_object_path,
    validate_ref_name,
    validate_repository_name,
)
from training_runtime.atomic_files import atomic_output

T = TypeVar("T")
log = logging.getLogger(__name__)
TRANSIENT_STATUSES = {429, 500, 502, 503, 504}
PAGE = 1000
DOWNLOAD_CHUNK_BYTES = 8 * 1024 * 1024


def http_status(error: StoreError) -> int | None:
    """The HTTP status lakeFS answered with, for errors raised from a response."""
    return getattr(error, "http_status", None)


class LakeFSVersionedStore(VersionedStore):
    def __init__(
        self, endpoint: str, access_key_id: str, secret_access_key: str, repository: str,
        storage_namespace: str | None = None, *, default_branch: str = MAIN,
        max_attempts: int = 5, backoff_s: float = 0.5, max_backoff_s: float = 10.0,
        connect_timeout_s: float = 5.0, read_timeout_s: float = 60.0,
    ):
        if not endpoint or not access_key_id or not secret_access_key:
            raise StoreError("the lakeFS store needs endpoint, access_key_id and secret_access_key")
        if max_attempts < 1:
            raise StoreError(f"max_attempts must be at least 1, got {max_attempts}")
        self.endpoint = endpoint.rstrip("/").removesuffix("/api/v1")
        self.access_key_id = access_key_id
        self.repository = validate_repository_name(repository)
        self.storage_namespace = storage_namespace
        self.default_branch = validate_ref_name(default_branch)
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._timeout = (connect_timeout_s, read_timeout_s)
        self._known_commit_ids: set[str] = set()
        configuration = lakefs_sdk.Configuration(
            host=f"{self.endpoint}/api/v1", username=access_key_id, password=secret_access_key,
        )
        # Attempts are counted and spaced by _call; urllib3's hidden retries would multiply them.
        configuration.retries = False
        self._sdk = LakeFSClient(configuration, header_name="X-Lakefs-Client", header_value="model-factory")

    def __repr__(self) -> str:
        return (f"LakeFSVersionedStore(endpoint={self.endpoint!r}, access_key_id={self.access_key_id!r}, "
                f"repository={self.repository!r})")

    def describe(self) -> dict[str, str]:
        return {"backend": "lakefs", "repository": self.repository, "endpoint": self.endpoint}

    def authenticated_user(self) -> StoreUser:
        """The lakeFS user behind this store's access key (``GET /api/v1/user``): the identity the
        audit trail records for writes made with these credentials."""
        current = self._call("read the current lakeFS user", self._sdk.auth_api.get_current_user)
        return StoreUser(id=current.user.id, detail=f"lakeFS user behind access key {self.access_key_id} at "
                                                     f"{self.endpoint} (GET /api/v1/user)")

    # --- request plumbing ---------------------------------------------------------------------
    def _call(self, what: str, fn: Callable[..., T], *args: Any,
              reconcile: Callable[[ApiException], T | None] | None = None, **kwargs: Any) -> T:
        """Run one SDK call with bounded retries; translate failures into StoreErrors.

        ``reconcile`` is asked, when a retry of a possibly-applied write gets a client error
        (409 exists, 400 no changes, 404 gone), whether the first attempt in fact succeeded.
        """
        maybe_applied = False
        last: str = ""
        for attempt in range(1, self.max_attempts + 1):
            try:
                return fn(*args, _request_timeout=self._timeout, **kwargs)
            except ApiException as exc:
                if exc.status in TRANSIENT_STATUSES:
                    maybe_applied = True
                    last = f"HTTP {exc.status} ({_server_message(exc)})"
                elif maybe_applied and reconcile is not None and (done := reconcile(exc)) is not None:
                    return done
                else:
                    raise self._translate(what, exc) from None
            except urllib3.exceptions.NewConnectionError as exc:
                last = f"connection refused ({_short(exc)})"  # nothing was sent
            except (urllib3.exceptions.HTTPError, ConnectionError) as exc:
                maybe_applied = True
                last = f"{type(exc).__name__} ({_short(exc)})"
            if attempt < self.max_attempts:
                delay = self._backoff(attempt)
                log.warning("%s: lakeFS attempt %d/%d failed (%s); retrying in %.2fs",
                            what, attempt, self.max_attempts, last, delay)
                time.sleep(delay)
        raise StoreError(
            f"{what}: lakeFS at {self.endpoint} kept failing after {self.max_attempts} attempts, "
            f"last: {last}; check that the server is up and healthy, then retry"
        )

    def _backoff(self, attempt: int) -> float:
        # Equal jitter: half the exponential delay is fixed, so the retries always span at least
        # backoff_s * (2**(max_attempts-1) - 1) / 2 seconds (3.75 s by default: a lakeFS restart);
        # the random half keeps concurrent runs that failed together out of lockstep.
        ceiling = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
        return ceiling / 2 + random.uniform(0, ceiling / 2)

    def _translate(self, what: str, exc: ApiException) -> StoreError:
        message = _server_message(exc)
        if exc.status == 404:
            error: StoreError = RefNotFoundError(
                f"{what}: not found in lakeFS repository {self.repository!r} ({message})")
        elif exc.status in (401, 403):
            error = StoreError(
                f"{what}: lakeFS at {self.endpoint} refused access key id {self.access_key_id!r} "
                f"(HTTP {exc.status}: {message}); check the access key id, secret and its policies"
            )
        else:
            error = StoreError(f"{what}: lakeFS answered HTTP {exc.status}: {message}")
        error.http_status = exc.status  # type: ignore[attr-defined]
        error.server_message = message  # type: ignore[attr-defined]
        return error

    def _pages(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Iterator[Any]:
        after = ""
        while True:
            page = self._call(what, fn, *args, after=after, amount=PAGE, **kwargs)
            yield from page.results
            if not page.pagination.has_more:
                return
            after = page.pagination.next_offset

    # --- repository and refs ---------------------------------------------------------------------
    def ensure_repository(self) -> None:
        repos = self._sdk.repositories_api
        try:
            self._call(f"look up repository {self.repository!r}", repos.get_repository, self.repository)
            return
        except RefNotFoundError:
            if not self.storage_namespace:
                raise StoreError(
                    f"lakeFS repository {self.repository!r} does not exist at {self.endpoint}; pass "
                    "storage_namespace (e.g. s3://bucket/prefix, or local://<name> on the quickstart) "
                    "to create it"
                ) from None
        creation = lakefs_sdk.RepositoryCreation(
            name=self.repository, storage_namespace=self.storage_namespace, default_branch=self.default_branch,
        )

        def created_meanwhile(exc: ApiException) -> bool | None:
            return True if exc.status == 409 else None

        try:
            self._call(f"create repository {self.repository!r}", repos.create_repository, creation,
                       reconcile=created_meanwhile)
        except StoreError as exc:
            # Another process may have created it between our lookup and create.
            if http_status(exc) != 409:
                raise

    def delete_repository(self) -> None:
        """Delete the repository (tests and teardown); its storage namespace is left as is."""
        self._call(f"delete repository {self.repository!r}", self._sdk.repositories_api.delete_repository,
                   self.repository)

    def create_branch(self, name: str, source_ref: str = MAIN, exist_ok: bool = False) -> str:
        validate_ref_name(name, "branch")
        validate_ref_name(source_ref, "ref")
        branches = self._sdk.branches_api
        source_commit = self.resolve_ref(source_ref)

        def ours(exc: ApiException) -> str | None:
            if exc.status == 409 and self._branch_head(name) == source_commit:
                return source_commit
            return None

        try:
            # Branch from the commit id, not the ref, so a moving source cannot race the check above.
            self._call(f"create branch {name!r}", branches.create_branch, self.repository,
                       lakefs_sdk.BranchCreation(name=name, source=source_commit), reconcile=ours)
        except StoreError as exc:
            if http_status(exc) != 409:
                raise
            if not self._is_branch(name):  # lakeFS answers 409 for a tag of that name too
                raise StoreError(f"cannot create branch {name!r}: a tag has that name in lakeFS repository "
                                 f"{self.repository!r}; pick another name") from None
            if exist_ok:
                return self._branch_head(name)
            raise StoreError(
                f"branch {name!r} already exists in lakeFS repository {self.repository!r}; pick another "
                "name or pass exist_ok=True"
            ) from None
        return source_commit

    def _branch_head(self, name: str) -> str:
        ref = self._call(f"read branch {name!r}", self._sdk.branches_api.get_branch, self.repository, name)
        return ref.commit_id

    def _is_branch(self, name: str) -> bool:
        if not is_branch_id(name):
            # A tag such as v1.0.0 can be no branch, and lakeFS answers 400 for asking.
            return False
        try:
            self._branch_head(name)
        except RefNotFoundError:
            return False
        return True

    def delete_branch(self, name: str) -> None:
        validate_ref_name(name, "branch")
        if name == self.default_branch:
            raise StoreError(f"refusing to delete the default branch {name!r}")

        def gone(exc: ApiException) -> bool | None:
            return True if exc.status == 404 else None

        self._call(f"delete branch {name!r}", self._sdk.branches_api.delete_branch, self.repository, name,
                   reconcile=gone)

    def list_branches(self) -> dict[str, str]:
        refs = self._pages("list branches", self._sdk.branches_api.list_branches, self.repository)
        return {r.id: r.commit_id for r in refs}

    def resolve_ref(self, ref: str) -> str:
        return self.get_commit(ref).id

    def get_commit(self, ref: str) -> Commit:
        validate_ref_name(ref, "ref")
        commit = self._call(f"resolve ref {ref!r}", self._sdk.commits_api.get_commit, self.repository, ref)
        return _to_commit(commit)

    def log(self, ref: str, limit: int = 100) -> list[Commit]:
        """The newest ``limit`` commits reachable from ``ref`` (all of them if fewer).

        Paged with lakeFS's ``limit=false``: a page of ``amount`` says ``has_more`` when more
        commits follow. With ``limit=true`` lakeFS stops at ``amount`` and always answers
        ``has_more=false`` (pkg/catalog/catalog.go ListCommits), so paging on it would end
        after the first page of 1000."""
        validate_ref_name(ref, "ref")
        out: list[Commit] = []
        after = ""
        while len(out) < limit:
            page = self._call(f"log of {ref!r}", self._sdk.refs_api.log_commits, self.repository, ref,
                              after=after, amount=min(PAGE, limit - len(out)), limit=False)
            out.extend(_to_commit(c) for c in page.results)
            if not page.pagination.has_more:
                break
            if not page.results or not page.pagination.next_offset:
                raise StoreError(
                    f"log of {ref!r}: lakeFS at {self.endpoint} said more commits follow but gave "
                    f"{len(page.results)} commits and next_offset {page.pagination.next_offset!r}; "
                    "check the server's version")
            after = page.pagination.next_offset
        return out[:limit]

    # --- objects ---------------------------------------------------------------------------------
    def put_object(self, branch: str, path: str, data: bytes) -> None:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise StoreError(f"put_object({path!r}) needs bytes, got {type(data).__name__}; encode text first")
        payload = bytes(data)
        self._upload(branch, path, lambda: payload, len(payload))

    def put_file(self, branch: str, path: str, local_path: Path) -> None:
        local_path = Path(local_path)
        if not local_path.is_file():
            raise StoreError(f"put_file: {local_path} is not a readable file")
        size = local_path.stat().st_size
        handles: list[Any] = []

        def open_fresh():
            # Each attempt streams the file from its start.
            for h in handles:
                h.close()
            handles.clear()
            handles.append(open(local_path, "rb"))
            return handles[0]

        try:
            self._upload(branch, path, open_fresh, size)
        finally:
            for h in handles:
                h.close()

    def _upload(self, branch: str, path: str, body: Callable[[], Any], size: int) -> None:
        """POST the raw body to the upload endpoint, streamed (the SDK's upload_object would
        build a multipart form in memory); the same route the ``lakefs`` package takes."""
        validate_ref_name(branch, "branch")
        validate_object_path(path)
        api_client = self._sdk.objects_api.api_client
        resource = f"/repositories/{quote(self.repository)}/branches/{quote(branch)}/objects"
        url = f"{self.endpoint}/api/v1{resource}?{urlencode({'path': path})}"

        def send(_request_timeout):
            headers = {"Content-Type": "application/octet-stream", "Accept": "application/json",
                       "Content-Length": str(size)}
            api_client.update_params_for_auth(headers, None, ["basic_auth"], resource, "POST", None)
            connect, read = _request_timeout
            response = api_client.rest_client.pool_manager.request(
                "POST", url, body=body(), headers=headers, timeout=urllib3.Timeout(connect=connect, read=read),
                retries=False, preload_content=True,
            )
            if not 200 <= response.status <= 299:
                raise ApiException(http_resp=response)
            return response

        self._call(f"upload {path!r} to branch {branch!r}", send)

    def delete_object(self, branch: str, path: str) -> None:
        validate_ref_name(branch, "branch")
        validate_object_path(path)
        # lakeFS deletes a missing path without complaint; the interface promises not-found.
        if not self.exists(branch, path):
            raise RefNotFoundError(f"object {path!r} not found on branch {branch!r}")

        def gone(exc: ApiException) -> bool | None:
            return True if exc.status == 404 else None

        self._call(f"delete {path!r} on branch {branch!r}", self._sdk.objects_api.delete_object,
                   self.repository, branch, path, reconcile=gone)

    def _stat(self, ref: str, path: str) -> lakefs_sdk.ObjectStats:
        validate_ref_name(ref, "ref")
        validate_object_path(path)
        return self._call(f"stat {path!r} at {ref!r}", self._sdk.objects_api.stat_object,
                          self.repository, ref, path)

    def exists(self, ref: str, path: str) -> bool:
        try:
            self._stat(ref, path)
        except RefNotFoundError:
            # Distinguish a missing object from a missing ref: the latter is an error.
            self.resolve_ref(ref)
            return False
        return True

    def get_object(self, ref: str, path: str) -> bytes:
        validate_ref_name(ref, "ref")
        validate_object_path(path)
        data = self._call(f"read {path!r} at {ref!r}", self._sdk.objects_api.get_object, self.repository, ref, path)
        return bytes(data)

    def stat_object(self, ref: str, path: str) -> ObjectInfo:
        stat = self._stat(ref, path)
        return ObjectInfo(path=stat.path, size_bytes=stat.size_bytes or 0, checksum=stat.checksum)

    def read_range(self, ref: str, path: str, start: int, length: int) -> bytes:
        """One ``GET .../objects`` with an HTTP ``Range`` header, through ``_call``'s retries.
        lakeFS answers 416 when ``start`` is at or past the end (an empty object has no byte to
        start at): that is the empty read the interface promises. A zero-length read sends no
        range (HTTP has none) but a stat, so a missing object still fails."""
        validate_ref_name(ref, "ref")
        validate_object_path(path)
        check_range(path, start, length)
        if length == 0:
            self._stat(ref, path)
            return b""
        try:
            data = self._call(f"read bytes {start}-{start + length - 1} of {path!r} at {ref!r}",
                              self._sdk.objects_api.get_object, self.repository, ref, path,
                              range=f"bytes={start}-{start + length - 1}")
        except StoreError as exc:
            if http_status(exc) == 416:
                return b""
            raise
        if len(data) > length:
            raise StoreError(f"read bytes {start}-{start + length - 1} of {path!r} at {ref!r}: lakeFS at "
                             f"{self.endpoint} sent {len(data)} bytes, more than the range; check that it "
                             "honours HTTP Range (lakeFS does)")
        return bytes(data)

    def copy_object(self, src_ref: str, src_path: str, dest_branch: str, dest_path: str | None = None) -> ObjectInfo:
        """lakeFS copies on its side (``POST .../branches/{branch}/objects/copy``,
        pkg/catalog/catalog.go CopyEntry): the blockstore copies the object to a new physical
        address (S3 CopyObject on S3), so its bytes never pass through this process. The copy
        keeps the source's checksum, size, content type and user metadata. A retry after a copy
        that was applied copies again onto the same staged path: the same result."""
        dest_path = src_path if dest_path is None else dest_path
        validate_ref_name(src_ref, "ref")
        validate_ref_name(dest_branch, "branch")
        validate_object_path(src_path)
        validate_object_path(dest_path)
        what = f"copy {src_path!r} at {src_ref!r} to {dest_path!r} on branch {dest_branch!r}"
        try:
            stats = self._call(what, self._sdk.objects_api.copy_object, self.repository, dest_branch, dest_path,
                               lakefs_sdk.ObjectCopyCreation(src_path=src_path, src_ref=src_ref))
        except RefNotFoundError as exc:
            # lakeFS answers 404 for both: "branch '<name>' not found" or the source's "not found".
            message = getattr(exc, "server_message", "")
            missing = (f"{dest_branch!r} is not a branch (copies are staged on a branch, not a tag or commit id)"
                       if message.startswith("branch ")
                       else f"{src_path!r} at {src_ref!r} does not exist (or that ref does not)")
            error = RefNotFoundError(f"{what}: {missing} in lakeFS repository {self.repository!r} ({message})")
            error.http_status, error.server_message = 404, message  # type: ignore[attr-defined]
            raise error from None
        return ObjectInfo(path=stats.path, size_bytes=stats.size_bytes or 0, checksum=stats.checksum)

    def download(self, ref: str, path: str, dest: Path) -> Path:
        """Fetched in ranged chunks: memory stays bounded and a failed chunk is retried alone."""
        size = self._stat(ref, path).size_bytes or 0
        dest = Path(dest)
        with atomic_output(dest) as out:
            for start in range(0, size, DOWNLOAD_CHUNK_BYTES):
                end = min(size, start + DOWNLOAD_CHUNK_BYTES) - 1
                chunk = self._call(f"read {path!r} at {ref!r}", self._sdk.objects_api.get_object,
                                   self.repository, ref, path, range=f"bytes={start}-{end}")
                if len(chunk) != end - start + 1:
                    raise StoreError(
                        f"read {path!r} at {ref!r}: got {len(chunk)} bytes for range {start}-{end}; "
                        "the object changed while downloading, read it at a commit id instead"
                    )
                out.write(chunk)
        return dest

    def list_objects(self, ref: str, prefix: str = "") -> list[ObjectInfo]:
        validate_ref_name(ref, "ref")
        stats = self._pages(f"list objects at {ref!r}", self._sdk.objects_api.list_objects, self.repository, ref,
                            prefix=prefix, delimiter="")
        out = [ObjectInfo(path=s.path, size_bytes=s.size_bytes or 0, checksum=s.checksum)
               for s in stats if s.path_type == "object"]
        return sorted(out, key=lambda o: o.path)

    def has_uncommitted_changes(self, branch: str) -> bool:
        validate_ref_name(branch, "branch")
        page = self._call(f"uncommitted changes on {branch!r}", self._sdk.branches_api.diff_branch,
                          self.repository, branch, amount=1)
        return bool(page.results)

    def uncommitted_diff(self, branch: str, prefix: str = "") -> list[DiffEntry]:
        validate_ref_name(branch, "branch")
        diffs = self._pages(f"uncommitted changes on {branch!r}", self._sdk.branches_api.diff_branch,
                            self.repository, branch, prefix=prefix, delimiter="")
        return sorted((DiffEntry(path=d.path, type=d.type) for d in diffs), key=lambda d: d.path)

    # --- history ---------------------------------------------------------------------------------
    def commit(self, branch: str, message: str, metadata: dict[str, str] | None = None,
               allow_empty: bool = False) -> Commit:
        validate_ref_name(branch, "branch")
        metadata = validate_metadata(metadata)
        if not isinstance(message, str) or not message.strip():
            raise StoreError("commit message is empty; say what the commit holds")
        head_before = self._branch_head(branch)

        def ours(exc: ApiException) -> Commit | None:
            # A retry after an applied commit finds "no changes"; the new head is our commit.
            head = self.get_commit(branch)
            if head.parents[:1] == (head_before,) and head.message == message and head.metadata == metadata:
                return head
            return None

        creation = lakefs_sdk.CommitCreation(message=message, metadata=metadata, allow_empty=allow_empty)
        try:
            commit = self._call(f"commit on branch {branch!r}", self._sdk.commits_api.commit,
                                self.repository, branch, creation, reconcile=ours)
        except StoreError as exc:
            if http_status(exc) == 400 and "no changes" in str(exc).lower():
                raise StoreError(
                    f"nothing to commit on branch {branch!r}: no uncommitted changes "
                    "(pass allow_empty=True to record an empty commit)"
                ) from None
            raise
        return commit if isinstance(commit, Commit) else _to_commit(commit)

    def merge(self, source_ref: str, destination_branch: str, message: str | None = None,
              metadata: dict[str, str] | None = None) -> str:
        validate_ref_name(source_ref, "ref")
        validate_ref_name(destination_branch, "branch")
        metadata = validate_metadata(metadata)
        source = self.resolve_ref(source_ref)

        def already_in(exc: ApiException) -> str | None:
            head = self.get_commit(destination_branch)
            return head.id if source in head.parents else None

        request = lakefs_sdk.Merge(message=message, metadata=metadata or None)
        try:
            result = self._call(f"merge {source_ref!r} into {destination_branch!r}",
                                self._sdk.refs_api.merge_into_branch, self.repository, source,
                                destination_branch, request, reconcile=already_in)
        except StoreError as exc:
            text = getattr(exc, "server_message", "").lower()
            if http_status(exc) == 409:
                paths = self._conflicting_paths(source, destination_branch)
                raise MergeConflictError(
                    f"merging {source_ref!r} into {destination_branch!r} conflicts on {len(paths)} path(s): "
                    f"{paths[:20]}; {destination_branch!r} is unchanged. Resolve by changing those paths on "
                    "one side and merge again.",
                    paths=paths,
                ) from None
            if http_status(exc) == 400 and "no changes" in text:
                return self.resolve_ref(destination_branch)  # source already contained: nothing to do
            if http_status(exc) == 400 and ("dirty" in text or "uncommitted" in text):
                raise StoreError(
                    f"cannot merge into {destination_branch!r}: it has uncommitted changes; commit or "
                    "discard them first"
                ) from None
            raise
        return result if isinstance(result, str) else result.reference

    def _conflicting_paths(self, source: str, destination_branch: str) -> list[str]:
        # lakeFS's merge conflict answer carries no paths; the three-dot compare marks them.
        diffs = self._pages("list merge conflicts", self._sdk.refs_api.diff_refs, self.repository,
                            destination_branch, source, type="three_dot", delimiter="")
        return sorted(d.path for d in diffs if d.type == "conflict")

    def create_tag(self, tag: str, ref: str) -> str:
        validate_ref_name(tag, "tag")
        commit_id = self.resolve_ref(ref)

        def ours(exc: ApiException) -> str | None:
            return commit_id if exc.status == 409 and self.list_tags().get(tag) == commit_id else None

        try:
            created = self._call(f"create tag {tag!r}", self._sdk.tags_api.create_tag, self.repository,
                                 lakefs_sdk.TagCreation(id=tag, ref=commit_id), reconcile=ours)
        except StoreError as exc:
            if http_status(exc) == 409 and self._is_branch(tag):  # lakeFS's 409 for a branch of that name
                raise StoreError(f"cannot create tag {tag!r}: a branch has that name; pick another name") from None
            if http_status(exc) == 409:
                raise StoreError(f"tag {tag!r} already exists; tags are immutable, pick a new name") from None
            raise
        return created if isinstance(created, str) else created.commit_id

    def list_tags(self) -> dict[str, str]:
        refs = self._pages("list tags", self._sdk.tags_api.list_tags, self.repository)
        return {r.id: r.commit_id for r in refs}

    def delete_tag(self, tag: str) -> None:
        validate_ref_name(tag, "tag")

        def gone(exc: ApiException) -> bool | None:
            return True if exc.status == 404 else None

        self._call(f"delete tag {tag!r}", self._sdk.tags_api.delete_tag, self.repository, tag, reconcile=gone)

    def diff(self, left_ref: str, right_ref: str, prefix: str = "") -> list[DiffEntry]:
        validate_ref_name(left_ref, "ref")
        validate_ref_name(right_ref, "ref")
        # Committed state on both sides, as the interface promises, whatever the refs are.
        left, right = self.resolve_ref(left_ref), self.resolve_ref(right_ref)
        diffs = self._pages(f"diff {left_ref!r}..{right_ref!r}", self._sdk.refs_api.diff_refs, self.repository,
                            left, right, prefix=prefix, type="two_dot", delimiter="")
        return sorted((DiffEntry(path=d.path, type=d.type) for d in diffs if d.path_type == "object"),
                      key=lambda d: d.path)

    # --- reading outside the store client ----------------------------------------------------------
    def pinned_location(self, commit_id: str, path: str) -> StoreLocation:
        validate_ref_name(commit_id, "commit id")
        validate_object_path(path)
        if commit_id in self._known_commit_ids:
            resolved = commit_id  # immutable: checked once, then one request per shard
        else:
            if self._is_branch(commit_id):
                raise StoreError(
                    f"pinned_location needs a commit id or tag, not the moving branch {commit_id!r}; "
                    "pass store.resolve_ref(branch)"
                )
            resolved = self.resolve_ref(commit_id)
            if resolved == commit_id:
                self._known_commit_ids.add(commit_id)
        stat = self._stat(resolved, path)
        return StoreLocation(
            uri=f"s3://{self.repository}/{resolved}/{path}",
            s3_endpoint_url=self.endpoint,
            extra={"commit_id": resolved, "path": path, "checksum": stat.checksum,
                   "size_bytes": str(stat.size_bytes or 0), "ui": self.ui_link(resolved)},
        )

    def ui_link(self, ref: str) -> str | None:
        return f"{self.endpoint}/repositories/{quote(self.repository)}/objects?{urlencode({'ref': ref})}"


def _to_commit(commit: lakefs_sdk.Commit) -> Commit:
    return Commit(
        id=commit.id, message=commit.message, metadata=dict(commit.metadata or {}),
        parents=tuple(commit.parents), creation_date=float(commit.creation_date),
    )


def _server_message(exc: ApiException) -> str:
    """The server's own explanation, without the response headers ApiException prints."""
    body = exc.body
    if isinstance(body, (bytes, bytearray)):
        body = body.decode("utf-8", "replace")
    if body:
        try:
            parsed = json.loads(body)
        except ValueError:
            return str(body)[:300]
        if isinstance(parsed, dict) and "message" in parsed:
            return str(parsed["message"])[:300]
        return str(body)[:300]
    return exc.reason or "no details"


def _short(exc: BaseException) -> str:
    return str(exc)[:200]
