"""A test server that speaks lakeFS's REST API (``/api/v1``), over its own model of lakeFS.

The versioning rules are in tests/support/lakefs_model.py, written from lakeFS's source; this
module is the HTTP side: routes, parameters and JSON shapes as lakeFS's api/swagger.yml and
pkg/api/controller.go give them, so the unmodified ``lakefs-sdk`` and ``lakefs`` wrapper work
against it. lakeFS's own wrapper integration tests (tests/store/lakefs_conformance) check it.
Requests need HTTP basic auth with the server's access key id and secret, as on lakeFS.

It also serves the S3 gateway's read path, ``GET``/``HEAD /<repository>/<ref>/<path>``, so
pinned ``s3://`` locations can be read with boto3: the access key id in the request's SigV4
credential must be the server's (the signature itself is not checked).

A FaultProxy sits in front: ``server.inject("503", 2)`` and friends make the next requests
fail the way an overloaded or flaky lakeFS would. ``direct_endpoint`` bypasses it.
"""

from __future__ import annotations

import base64
import json
import re
import socket
import tempfile
import threading
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO
from urllib.parse import parse_qs, unquote, urlparse

from tests.support.fault_proxy import FaultProxy
from tests.support.lakefs_model import (
    MAX_DELETE_PATHS,
    NAMESPACE_REGEX,
    Commit,
    Entry,
    LakeFSError,
    LakeFSModel,
    Repository,
    listing,
    page,
)

MAX_PER_PAGE, DEFAULT_PER_PAGE = 1000, 100  # pkg/api/controller.go DefaultMaxPerPage, DefaultPerPage
MIN_AMOUNT = -1  # api/swagger.yml PaginationAmount minimum
METADATA_HEADER = "x-lakefs-meta-"  # pkg/api/apiutil/constant.go LakeFSHeaderMetadataPrefix
SPOOL_BYTES = 1 << 20
# What GET /config says about the one blockstore (pkg/block/local/adapter.go GetStorageNamespaceInfo).
STORAGE_CONFIG = {
    "blockstore_type": "local", "blockstore_namespace_example": "local://example-bucket/",
    "blockstore_namespace_ValidityRegex": NAMESPACE_REGEX.pattern, "default_namespace_prefix": "local://",
    "pre_sign_support": False, "pre_sign_support_ui": False, "import_support": False,
    "import_validity_regex": NAMESPACE_REGEX.pattern, "pre_sign_multipart_upload": False,
    "blockstore_id": "", "blockstore_description": "",
}
# The username of the one user behind the server's access key (GET /user; core/identity.py reads it).
TEST_USER_ID = "model-factory-tester"


class LakeFSTestServer:
    def __init__(self, root: Path, access_key_id: str = "AKIATESTSERVER",
                 secret_access_key: str = "test-secret-key", stall_s: float = 30.0,
                 user_id: str = "", user_email: str | None = None,
                 user_friendly_name: str | None = "model-factory tests"):
        self.root = Path(root)
        self.stall_s = stall_s
        self.access_key_id = access_key_id
        self.secret_access_key = secret_access_key
        # The one user the access key belongs to (GET /user, and the committer of every commit).
        self.user_id = user_id or TEST_USER_ID
        self.user_email = user_email
        self.user_friendly_name = user_friendly_name
        self.model = LakeFSModel(self.root / "blobs")
        self._server: ThreadingHTTPServer | None = None
        self.proxy: FaultProxy | None = None
        # Object bytes sent, by object path (GET, ranged or whole, on the API and the S3 gateway):
        # what tests of ranged reads count, as a bill for lakeFS's egress would.
        self.bytes_served: dict[str, int] = {}
        self._served_lock = threading.Lock()

    def served(self, path: str) -> int:
        """Object bytes of ``path`` sent so far (every repository and ref)."""
        with self._served_lock:
            return self.bytes_served.get(path, 0)

    def _count_served(self, path: str, length: int) -> None:
        with self._served_lock:
            self.bytes_served[path] = self.bytes_served.get(path, 0) + length

    def start(self) -> LakeFSTestServer:
        owner = self

        class Handler(_Handler):
            server_state = owner

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="lakefs-test-server", daemon=True).start()
        self.proxy = FaultProxy(self.direct_endpoint, stall_s=self.stall_s).start()
        return self

    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()
            self.proxy = None
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> LakeFSTestServer:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    @property
    def direct_endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def endpoint(self) -> str:
        """The URL clients use: through the fault proxy."""
        return self.proxy.url

    def inject(self, kind: str, count: int = 1) -> None:
        self.proxy.inject(kind, count)


# --- JSON shapes (api/swagger.yml) ----------------------------------------------------------------

def repository_json(repo: Repository) -> dict:
    return {"id": repo.id, "creation_date": repo.creation_date, "default_branch": repo.default_branch,
            "storage_id": "", "storage_namespace": repo.storage_namespace, "read_only": False}


def commit_json(c: Commit) -> dict:
    return {"id": c.id, "parents": list(c.parents), "committer": c.committer, "message": c.message,
            "creation_date": c.creation_ns // 10**9, "meta_range_id": c.meta_range_id,
            "metadata": dict(c.metadata), "generation": c.generation, "version": 1}


def stats_json(path: str, e: Entry | None) -> dict:
    if e is None:  # a common prefix: Go marshals the unset fields as zero values
        return {"path": path, "path_type": "common_prefix", "physical_address": "", "checksum": "", "mtime": 0}
    return {"path": path, "path_type": "object", "physical_address": e.address, "checksum": e.checksum,
            "size_bytes": e.size, "mtime": e.mtime, "content_type": e.content_type, "metadata": dict(e.metadata)}


def diff_json(path: str, row: tuple[str, Entry | None] | None) -> dict:
    if row is None:
        return {"type": "prefix_changed", "path": path, "path_type": "common_prefix"}
    kind, entry = row
    return {"type": kind, "path": path, "path_type": "object", "size_bytes": entry.size if entry else 0}


def listing_json(rows: list, key, has_more: bool) -> dict:
    """pkg/api/controller.go paginationFor: next_offset only when there is more."""
    return {"pagination": {"has_more": has_more, "next_offset": key(rows[-1]) if has_more and rows else "",
                           "results": len(rows), "max_per_page": MAX_PER_PAGE}, "results": rows}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_state: LakeFSTestServer

    def log_message(self, format, *args):  # keep test output quiet
        return

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in separate writes; without NODELAY, Nagle's algorithm and
        # delayed ACKs add ~40 ms to every request.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    @property
    def model(self) -> LakeFSModel:
        return self.server_state.model

    # --- plumbing ---------------------------------------------------------------------------
    def _send(self, status: int, body: bytes = b"", content_type: str = "application/json",
              headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj) -> None:
        self._send(status, json.dumps(obj).encode())

    def _error(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps({"message": message}).encode(), headers=headers)

    def _read_body(self) -> IO[bytes] | None:
        """The whole request body, de-chunked; None when the request declares no length at all.
        A chunked upload is stored whole, never as the empty body a naive reader would see."""
        encoding = self.headers.get("Transfer-Encoding", "").lower().strip()
        length = self.headers.get("Content-Length")
        if not encoding and length is None:
            return None
        body = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES, dir=self.model.blob_dir)
        if encoding == "chunked":
            while size := self._number(self.rfile.readline().split(b";")[0].strip() or b"0", 16, "chunk size"):
                body.write(self._read_exactly(size))
                self.rfile.readline()  # the CRLF after each chunk
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                continue  # trailers, up to the blank line that ends the body
        elif encoding:
            self.close_connection = True
            raise LakeFSError(501, f"Transfer-Encoding {encoding!r} is not supported; send chunked or Content-Length")
        else:
            remaining = self._number(length, 10, "Content-Length")
            while remaining > 0:
                chunk = self._read_exactly(min(remaining, SPOOL_BYTES))
                body.write(chunk)
                remaining -= len(chunk)
        body.seek(0)
        return body

    def _number(self, text: str | bytes, base: int, what: str) -> int:
        try:
            value = int(text, base)
        except ValueError:
            value = -1
        if value < 0:
            self.close_connection = True  # the body's end is unknown: the connection cannot go on
            raise LakeFSError(400, f"bad {what} {text!r}")
        return value

    def _read_exactly(self, size: int) -> bytes:
        data = self.rfile.read(size)
        if len(data) != size:
            self.close_connection = True
            raise LakeFSError(400, f"request body ended after {len(data)} of {size} bytes")
        return data

    def _authorized(self) -> bool:
        state = self.server_state
        expected = base64.b64encode(f"{state.access_key_id}:{state.secret_access_key}".encode()).decode()
        return self.headers.get("Authorization", "") == f"Basic {expected}"

    def _dispatch(self) -> None:
        parsed = urlparse(self.path)
        query = {k: v[-1] for k, v in parse_qs(parsed.query, keep_blank_values=True).items()}
        body = None
        try:
            body = self._read_body()  # read first: whatever the answer, the connection stays usable
            if not parsed.path.startswith("/api/v1/"):
                self._s3_gateway(parsed.path)
                return
            if not self._authorized():
                raise LakeFSError(401, "error authenticating request")
            route = parsed.path[len("/api/v1"):]
            for method, pattern, handler in ROUTES:
                if method == self.command and (m := pattern.fullmatch(route)):
                    args = [unquote(g) for g in m.groups()]
                    if handler in STREAMING:  # they lock around the model themselves, not around I/O
                        handler(self, *args, query=query, body=body)
                    else:
                        with self.model.lock:
                            handler(self, *args, query=query, body=body)
                    return
            raise LakeFSError(404, f"the lakeFS test server does not serve {self.command} {route}")
        except LakeFSError as exc:
            self._error(exc.status, exc.message, getattr(exc, "headers", None))
        except Exception as exc:
            # A bug here must reach the test as a 500 naming it, not as a dropped connection
            # that the client would retry as a transient fault.
            traceback.print_exc()
            self._error(500, f"lakeFS test server failed: {exc!r}")
        finally:
            if body is not None:
                body.close()

    do_GET = do_POST = do_DELETE = do_PUT = do_HEAD = _dispatch

    def _body_json(self, body: IO[bytes] | None) -> dict:
        raw = body.read() if body is not None else b""
        try:
            spec = json.loads(raw) if raw else {}
        except ValueError as exc:
            raise LakeFSError(400, f"request body is not JSON: {exc}") from None
        if not isinstance(spec, dict):
            raise LakeFSError(400, "request body must be a JSON object")
        return spec

    def _amount(self, query: dict[str, str]) -> int:
        """api/swagger.yml PaginationAmount (integer, minimum -1, maximum 1000), which lakeFS's
        request validator (pkg/api/serve.go, kin-openapi) enforces with a 400 before any handler
        runs; then pkg/api/controller.go paginationAmount (0 and -1 mean the default)."""
        text = query.get("amount") or str(DEFAULT_PER_PAGE)
        refused = 'parameter "amount" in query has an error: '
        if not re.fullmatch(r"-?\d+", text):
            raise LakeFSError(400, f"{refused}value {text}: an invalid integer: invalid syntax")
        amount = int(text)
        if amount > MAX_PER_PAGE:
            raise LakeFSError(400, f"{refused}number must be at most {MAX_PER_PAGE}")
        if amount < MIN_AMOUNT:
            raise LakeFSError(400, f"{refused}number must be at least {MIN_AMOUNT}")
        return DEFAULT_PER_PAGE if amount <= 0 else amount

    @staticmethod
    def _flag(query: dict[str, str], name: str) -> bool:
        return query.get(name, "false").lower() == "true"

    @property
    def committer(self) -> str:
        """What lakeFS records as a commit's committer: the authenticated user's email, or its
        username when it has none (pkg/auth/model/model.go User.Committer), never the key id."""
        state = self.server_state
        return state.user_email or state.user_id

    def current_user(self, query, body):
        """GET /user (pkg/api/controller.go GetCurrentUser): the user the request's key belongs
        to; this server has one key, so one user. ``friendly_name`` falls back to the username."""
        state = self.server_state
        user = {"id": state.user_id, "creation_date": 0, "friendly_name": state.user_friendly_name or state.user_id}
        if state.user_email:
            user["email"] = state.user_email
        self._json(200, {"user": user})

    # --- config -----------------------------------------------------------------------------
    def get_config(self, query, body):
        self._json(200, {"version_config": {"version": "lakefs-test-server"}, "storage_config": STORAGE_CONFIG,
                         "storage_config_list": [], "capabilities_config": {}})

    def get_storage_config(self, query, body):
        self._json(200, STORAGE_CONFIG)

    def healthcheck(self, query, body):
        self._send(204)

    # --- repositories -------------------------------------------------------------------------
    def create_repository(self, query, body):
        spec = self._body_json(body)
        # After the "already exists" check, as lakeFS orders them (controller.go CreateRepository).
        special = self._flag(query, "bare") or spec.get("read_only") or spec.get("sample_data")
        if special and spec.get("name") not in self.model.repositories:
            raise LakeFSError(501, "the lakeFS test server creates plain repositories only: "
                                   "no bare, read-only or sample-data ones")
        repo = self.model.create_repository(spec.get("name", ""), spec.get("storage_namespace", ""),
                                            spec.get("default_branch") or "", spec.get("storage_id") or "")
        self._json(201, repository_json(repo))

    def list_repositories(self, query, body):
        repos = [repository_json(r) for _, r in sorted(self.model.repositories.items())
                 if r.id.startswith(query.get("prefix", "")) and query.get("search", "") in r.id]
        rows, more = page(repos, lambda r: r["id"], query.get("after", ""), self._amount(query))
        self._json(200, listing_json(rows, lambda r: r["id"], more))

    def get_repository(self, repo, query, body):
        self._json(200, repository_json(self.model.repo(repo)))

    def get_repository_metadata(self, repo, query, body):
        self._json(200, dict(self.model.repo(repo).metadata))

    def delete_repository(self, repo, query, body):
        self.model.delete_repository(repo)
        self._send(204)

    # --- branches -------------------------------------------------------------------------------
    def list_branches(self, repo, query, body):
        show_hidden = self._flag(query, "show_hidden")
        refs = [{"id": name, "commit_id": b.head} for name, b in sorted(self.model.repo(repo).branches.items())
                if name.startswith(query.get("prefix", "")) and (show_hidden or not b.hidden)]
        rows, more = page(refs, lambda r: r["id"], query.get("after", ""), self._amount(query))
        self._json(200, listing_json(rows, lambda r: r["id"], more))

    def create_branch(self, repo, query, body):
        spec = self._body_json(body)
        head = self.model.create_branch(self.model.repo(repo), spec.get("name", ""), spec.get("source", ""),
                                        bool(spec.get("hidden")))
        self._send(201, head.encode(), content_type="text/plain; charset=utf-8")  # the commit id, as text

    def get_branch(self, repo, branch, query, body):
        self._json(200, {"id": branch, "commit_id": self.model.branch(self.model.repo(repo), branch).head})

    def delete_branch(self, repo, branch, query, body):
        self.model.delete_branch(self.model.repo(repo), branch)
        self._send(204)

    def reset_branch(self, repo, branch, query, body):
        spec = self._body_json(body)
        self.model.reset(self.model.repo(repo), branch, spec.get("type", ""), spec.get("path") or "")
        self._send(204)

    def diff_branch(self, repo, branch, query, body):
        rows = self.model.uncommitted(self.model.repo(repo), branch)
        self._diff_listing([(p, (k, e)) for p, k, e in rows], query)

    def _diff_listing(self, rows: list, query: dict[str, str]) -> None:
        rows = listing(rows, query.get("prefix", ""), query.get("delimiter", ""))
        chosen, more = page(rows, lambda r: r[0], query.get("after", ""), self._amount(query))
        self._json(200, listing_json([diff_json(p, r) for p, r in chosen], lambda r: r["path"], more))

    def revert_branch(self, repo, branch, query, body):
        spec = self._body_json(body)
        overrides = spec.get("commit_overrides") or {}
        self.model.revert(self.model.repo(repo), branch, spec.get("ref", ""), spec.get("parent_number"),
                          self.committer, bool(spec.get("allow_empty")), overrides.get("message"),
                          overrides.get("metadata"))
        self._send(204)

    def cherry_pick(self, repo, branch, query, body):
        spec = self._body_json(body)
        overrides = spec.get("commit_overrides") or {}
        commit = self.model.cherry_pick(self.model.repo(repo), branch, spec.get("ref", ""), spec.get("parent_number"),
                                        self.committer, overrides.get("message"), overrides.get("metadata"))
        self._json(201, commit_json(commit))

    # --- objects --------------------------------------------------------------------------------
    def upload_object(self, repo, branch, query, body):
        """pkg/api/controller.go UploadObject, raw bodies only."""
        if body is None:
            raise LakeFSError(411, "length required: send Content-Length or Transfer-Encoding: chunked")
        content_type = self.headers.get("Content-Type", "")
        if content_type.startswith("multipart/"):
            raise LakeFSError(501, "the lakeFS test server takes raw uploads only, not multipart/form-data")
        if_none_match = self.headers.get("If-None-Match")
        if if_none_match not in (None, "*"):
            raise LakeFSError(501, "If-None-Match only supports '*'")  # pkg/api/apiutil/conditions.go
        if self.headers.get("If-Match") is not None:
            raise LakeFSError(501, "If-Match is not implemented")
        path = query.get("path", "")
        with self.model.lock:  # as lakeFS: refuse before storing the bytes, and check again when staging
            state = self.model.repo(repo)
            self.model.branch(state, branch)
            if if_none_match and path in self.model.view(state, branch):
                raise LakeFSError(412, "path already exists")
        # Header names in lowercase, as Go's canonical headers end up (controller.go extractLakeFSMetadata).
        metadata = {k.lower()[len(METADATA_HEADER):]: v for k, v in self.headers.items()
                    if k.lower().startswith(METADATA_HEADER)}
        entry = self.model.write_blob(repo, body, content_type, metadata)
        with self.model.lock:
            self.model.stage(self.model.repo(repo), branch, path, entry, if_none_match=bool(if_none_match))
        self._json(201, stats_json(path, entry))

    def stat_object(self, repo, ref, query, body):
        path = query.get("path", "")
        entry = self.model.entry(self.model.repo(repo), ref, path)
        stats = stats_json(path, entry)
        if query.get("user_metadata", "true").lower() == "false":
            stats["metadata"] = {}
        self._json(200, stats)

    def list_objects(self, repo, ref, query, body):
        tree = self.model.view(self.model.repo(repo), ref)
        rows = listing(list(tree.items()), query.get("prefix", ""), query.get("delimiter", ""))
        chosen, more = page(rows, lambda r: r[0], query.get("after", ""), self._amount(query))
        self._json(200, listing_json([stats_json(p, e) for p, e in chosen], lambda r: r["path"], more))

    def get_object(self, repo, ref, query, body):
        with self.model.lock:
            entry = self.model.entry(self.model.repo(repo), ref, query.get("path", ""))
        self._send_object(entry, query.get("path", ""))  # blobs never change: streamed without the lock

    def _send_object(self, entry: Entry, path: str) -> None:
        """GetObject and HeadObject: whole, or one byte range (pkg/httputil/range.go ParseRange)."""
        size, status = entry.size, 200
        headers = {"ETag": f'"{entry.checksum}"', "Accept-Ranges": "bytes"}
        start, end = 0, size - 1
        if (spec := self.headers.get("Range")) is not None:
            start, end = parse_range(spec, size)
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        length = max(0, end - start + 1)
        self.send_response(status)
        self.send_header("Content-Type", entry.content_type)
        self.send_header("Content-Length", str(length))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command == "HEAD":
            return
        self.server_state._count_served(path, length)
        # Streamed in chunks: a test server must not hold whole objects in memory either.
        with open(self.model.blob_file(entry), "rb") as f:
            f.seek(start)
            while length > 0 and (chunk := f.read(min(length, SPOOL_BYTES))):
                self.wfile.write(chunk)
                length -= len(chunk)

    def head_object(self, repo, ref, query, body):
        self.get_object(repo, ref, query, body)

    def delete_object(self, repo, branch, query, body):
        self.model.delete_object(self.model.repo(repo), branch, query.get("path", ""))
        self._send(204)

    def delete_objects(self, repo, branch, query, body):
        paths = self._body_json(body).get("paths") or []
        if len(paths) > MAX_DELETE_PATHS:
            raise LakeFSError(400, f"request size exceeded, max paths is set to {MAX_DELETE_PATHS}")
        state = self.model.repo(repo)
        for path in paths:
            self.model.delete_object(state, branch, path)
        self._json(200, {"errors": []})

    def copy_object(self, repo, branch, query, body):
        """pkg/api/controller.go CopyObject: 201 with the copy's ObjectStats. The required
        ``dest_path`` and ``src_path`` are checked first, by lakeFS's request validator
        (pkg/api/serve.go, kin-openapi against api/swagger.yml), as 400s."""
        spec = self._body_json(body)
        if "dest_path" not in query:
            raise LakeFSError(400, 'parameter "dest_path" in query has an error: value is required but missing')
        if not isinstance(spec.get("src_path"), str):
            raise LakeFSError(400, 'request body has an error: doesn\'t match schema: Error at "/src_path": '
                                   'property "src_path" is missing')
        if spec.get("shallow"):
            raise LakeFSError(501, "Not Implemented")  # pkg/api/apiutil/conditions.go BuildOptsFromParams
        dest = query["dest_path"]
        entry = self.model.copy(repo, branch, dest, spec.get("src_ref") or "", spec["src_path"])
        self._json(201, stats_json(dest, entry))

    # --- commits, log, diff, merge --------------------------------------------------------------
    def commit(self, repo, branch, query, body):
        spec = self._body_json(body)
        commit = self.model.commit(self.model.repo(repo), branch, self.committer, spec.get("message", ""),
                                   spec.get("metadata") or {}, bool(spec.get("allow_empty")))
        self._json(201, commit_json(commit))

    def get_commit(self, repo, ref, query, body):
        state = self.model.repo(repo)
        self._json(200, commit_json(state.commits[self.model.resolve(state, ref)]))

    def log_commits(self, repo, ref, query, body):
        if query.get("objects") or query.get("prefixes") or query.get("since") or query.get("stop_at") \
                or self._flag(query, "first_parent"):
            raise LakeFSError(501, "the lakeFS test server's log takes ref, after, amount and limit only")
        commits, more = self.model.log(self.model.repo(repo), ref, query.get("after", ""), self._amount(query),
                                       self._flag(query, "limit"))
        self._json(200, listing_json([commit_json(c) for c in commits], lambda r: r["id"], more))

    def diff_refs(self, repo, left, right, query, body):
        state = self.model.repo(repo)
        if query.get("type", "three_dot") == "two_dot":
            rows = self.model.two_dot(state.commits[self.model.resolve(state, left)].tree,
                                      state.commits[self.model.resolve(state, right)].tree)
        else:
            rows = self.model.three_dot(state, left, right)
        self._diff_listing([(p, (k, e)) for p, k, e in rows], query)

    def merge(self, repo, source, destination, query, body):
        spec = self._body_json(body)
        try:
            commit = self.model.merge(self.model.repo(repo), source, destination, self.committer,
                                      spec.get("message") or "", spec.get("metadata") or {},
                                      spec.get("strategy") or "", bool(spec.get("allow_empty")),
                                      bool(spec.get("squash_merge")))
        except LakeFSError as exc:
            if exc.status != 409:
                raise
            self._json(409, {"reference": ""})  # a conflict answers a MergeResult (controller.go MergeIntoBranch)
            return
        self._json(200, {"reference": commit.id})

    # --- tags -----------------------------------------------------------------------------------
    def list_tags(self, repo, query, body):
        refs = [{"id": t, "commit_id": c} for t, c in sorted(self.model.repo(repo).tags.items())
                if t.startswith(query.get("prefix", ""))]
        rows, more = page(refs, lambda r: r["id"], query.get("after", ""), self._amount(query))
        self._json(200, listing_json(rows, lambda r: r["id"], more))

    def create_tag(self, repo, query, body):
        spec = self._body_json(body)
        commit_id = self.model.create_tag(self.model.repo(repo), spec.get("id", ""), spec.get("ref", ""))
        self._json(201, {"id": spec.get("id"), "commit_id": commit_id})

    def get_tag(self, repo, tag, query, body):
        self._json(200, {"id": tag, "commit_id": self.model.tag(self.model.repo(repo), tag)})

    def delete_tag(self, repo, tag, query, body):
        self.model.delete_tag(self.model.repo(repo), tag)
        self._send(204)

    # --- S3 gateway (read only) -------------------------------------------------------------------
    def _s3_gateway(self, path: str) -> None:
        parts = unquote(path).lstrip("/").split("/", 2)
        if self.command not in ("GET", "HEAD") or len(parts) != 3:
            self._send(501, b"<Error><Code>NotImplemented</Code></Error>", content_type="application/xml")
            return
        credential = re.search(r"Credential=([^/,\s]+)/", self.headers.get("Authorization", ""))
        if credential is None or credential.group(1) != self.server_state.access_key_id:
            self._send(403, b"<Error><Code>InvalidAccessKeyId</Code></Error>", content_type="application/xml")
            return
        repo, ref, key = parts
        try:
            with self.model.lock:
                entry = self.model.entry(self.model.repo(repo), ref, key)
        except LakeFSError:
            self._send(404, b"<Error><Code>NoSuchKey</Code></Error>", content_type="application/xml")
            return
        self._send_object(entry, key)


def parse_range(spec: str, size: int) -> tuple[int, int]:
    """pkg/httputil/range.go ParseRange: one range; the end is clipped to the object. An
    unsatisfiable start answers 416 with ``Content-Range: bytes */size`` (controller.go GetObject)."""
    unsatisfiable = LakeFSError(416, "Requested Range Not Satisfiable")
    unsatisfiable.headers = {"Content-Range": f"bytes */{size}"}
    m = re.fullmatch(r"bytes=\s*(\d*)\s*-\s*(\d*)\s*", spec)
    if m is None or m.groups() == ("", ""):
        raise LakeFSError(416, "Requested Range Not Satisfiable")  # a bad range: no Content-Range
    first, last = m.groups()
    if first == "":
        suffix = int(last)
        if suffix == 0:
            raise unsatisfiable
        return max(0, size - suffix), size - 1
    start = int(first)
    end = size - 1 if last == "" else int(last)
    if last != "" and start > end:
        raise LakeFSError(416, "Requested Range Not Satisfiable")
    if start > size - 1:
        raise unsatisfiable
    return start, min(end, size - 1)


_SEG = r"([^/]+)"
_REPO = rf"/repositories/{_SEG}"
ROUTES = [
    (method, re.compile(pattern), handler)
    for method, pattern, handler in [
        ("GET", r"/config", _Handler.get_config),
        ("GET", r"/config/storage", _Handler.get_storage_config),
        ("GET", r"/healthcheck", _Handler.healthcheck),
        ("GET", r"/repositories", _Handler.list_repositories),
        ("POST", r"/repositories", _Handler.create_repository),
        ("GET", _REPO, _Handler.get_repository),
        ("DELETE", _REPO, _Handler.delete_repository),
        ("GET", rf"{_REPO}/metadata", _Handler.get_repository_metadata),
        ("GET", rf"{_REPO}/branches", _Handler.list_branches),
        ("POST", rf"{_REPO}/branches", _Handler.create_branch),
        ("GET", rf"{_REPO}/branches/{_SEG}", _Handler.get_branch),
        ("DELETE", rf"{_REPO}/branches/{_SEG}", _Handler.delete_branch),
        ("PUT", rf"{_REPO}/branches/{_SEG}", _Handler.reset_branch),
        ("GET", rf"{_REPO}/branches/{_SEG}/diff", _Handler.diff_branch),
        ("POST", rf"{_REPO}/branches/{_SEG}/revert", _Handler.revert_branch),
        ("POST", rf"{_REPO}/branches/{_SEG}/cherry-pick", _Handler.cherry_pick),
        ("POST", rf"{_REPO}/branches/{_SEG}/commits", _Handler.commit),
        ("POST", rf"{_REPO}/branches/{_SEG}/objects", _Handler.upload_object),
        ("DELETE", rf"{_REPO}/branches/{_SEG}/objects", _Handler.delete_object),
        ("POST", rf"{_REPO}/branches/{_SEG}/objects/delete", _Handler.delete_objects),
        ("POST", rf"{_REPO}/branches/{_SEG}/objects/copy", _Handler.copy_object),
        ("GET", rf"{_REPO}/commits/{_SEG}", _Handler.get_commit),
        ("GET", rf"{_REPO}/refs/{_SEG}/commits", _Handler.log_commits),
        ("GET", rf"{_REPO}/refs/{_SEG}/objects", _Handler.get_object),
        ("HEAD", rf"{_REPO}/refs/{_SEG}/objects", _Handler.head_object),
        ("GET", rf"{_REPO}/refs/{_SEG}/objects/stat", _Handler.stat_object),
        ("GET", rf"{_REPO}/refs/{_SEG}/objects/ls", _Handler.list_objects),
        ("GET", rf"{_REPO}/refs/{_SEG}/diff/{_SEG}", _Handler.diff_refs),
        ("POST", rf"{_REPO}/refs/{_SEG}/merge/{_SEG}", _Handler.merge),
        ("GET", rf"{_REPO}/tags", _Handler.list_tags),
        ("POST", rf"{_REPO}/tags", _Handler.create_tag),
        ("GET", rf"{_REPO}/tags/{_SEG}", _Handler.get_tag),
        ("DELETE", rf"{_REPO}/tags/{_SEG}", _Handler.delete_tag),
        ("GET", r"/user", _Handler.current_user),
    ]
]
STREAMING = {_Handler.upload_object, _Handler.get_object, _Handler.head_object, _Handler.copy_object}

