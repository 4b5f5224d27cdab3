"""A test server that speaks lakeFS's REST API (``/api/v1``) over LocalVersionedStore.

Only the endpoints LakeFSVersionedStore calls are served, with the JSON shapes of lakeFS's
OpenAPI spec, so the unmodified ``lakefs-sdk`` deserializes every answer with its own models.
Requests need HTTP basic auth with the server's access key id and secret, as on lakeFS.

It also serves the S3 gateway's read path, ``GET /<repository>/<ref>/<path>``, so pinned
``s3://`` locations can be read with boto3 (signatures are not checked there).

A FaultProxy sits in front: ``server.inject("503", 2)`` and friends make the next requests
fail the way an overloaded or flaky lakeFS would.
"""

from __future__ import annotations

import base64
import json
import re
import socket
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

from resources.store.base import (
    MAIN,
    Commit,
    MergeConflictError,
    RefNotFoundError,
    StoreError,
)
from resources.store.local import LocalVersionedStore
from tests.support.fault_proxy import FaultProxy

MERGE_STRATEGY_KEY = ".lakefs.merge.strategy"


class ApiError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class LakeFSTestServer:
    def __init__(self, root: Path, access_key_id: str = "AKIATESTSERVER",
                 secret_access_key: str = "test-secret-key", stall_s: float = 30.0):
        self.root = Path(root)
        self.stall_s = stall_s
        self.access_key_id = access_key_id
        self.secret_access_key = secret_access_key
        self.namespaces: dict[str, str] = {}
        self.created: dict[str, int] = {}
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.proxy: FaultProxy | None = None

    # --- lifecycle -------------------------------------------------------------------------------
    def start(self) -> LakeFSTestServer:
        owner = self

        class Handler(_Handler):
            server_state = owner

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="lakefs-test-server", daemon=True)
        self._thread.start()
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

    # --- repositories ------------------------------------------------------------------------------
    def repo(self, name: str) -> LocalVersionedStore:
        store = LocalVersionedStore(self.root, name)
        if not (store.repo_dir / "repository.json").exists():
            raise ApiError(404, f"repository not found: {name}")
        return store


def _commit_json(commit: Commit, committer: str) -> dict:
    return {
        "id": commit.id, "parents": list(commit.parents), "committer": committer,
        "message": commit.message, "creation_date": int(commit.creation_date), "meta_range_id": "",
        "metadata": dict(commit.metadata), "version": 1,
    }


def _page(items: list, key, query: dict[str, str]) -> dict:
    """lakeFS pagination: items after ``after`` (by key), at most ``amount``."""
    after = query.get("after", "")
    amount = int(query.get("amount") or 100)
    if amount < 0 or amount > 1000:
        amount = 1000
    rest = [i for i in items if key(i) > after] if after else list(items)
    chosen = rest[:amount]
    has_more = len(rest) > amount
    return {
        "pagination": {"has_more": has_more, "next_offset": key(chosen[-1]) if chosen and has_more else "",
                       "results": len(chosen), "max_per_page": 1000},
        "results": chosen,
    }


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

    # --- plumbing ---------------------------------------------------------------------------------
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

    def _body_json(self) -> dict:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        return json.loads(raw) if raw else {}

    def _authorized(self) -> bool:
        expected = base64.b64encode(
            f"{self.server_state.access_key_id}:{self.server_state.secret_access_key}".encode()
        ).decode()
        return self.headers.get("Authorization", "") == f"Basic {expected}"

    def _dispatch(self) -> None:
        parsed = urlparse(self.path)
        query = {k: v[-1] for k, v in parse_qs(parsed.query, keep_blank_values=True).items()}
        try:
            if not parsed.path.startswith("/api/v1/"):
                self._s3_gateway(parsed.path)
                return
            # Drain a JSON body first so the connection stays usable whatever we answer.
            if not self._authorized():
                self._drain()
                raise ApiError(401, "error authenticating request")
            route = parsed.path[len("/api/v1"):]
            for method, pattern, handler in ROUTES:
                if method == self.command and (m := pattern.fullmatch(route)):
                    handler(self, *[unquote(g) for g in m.groups()], query=query)
                    return
            self._drain()
            raise ApiError(404, f"test server does not serve {self.command} {route}")
        except ApiError as exc:
            self._error(exc.status, exc.message)
        except MergeConflictError:
            self._error(409, "conflict found")
        except RefNotFoundError as exc:
            self._error(404, f"not found: {exc}")
        except StoreError as exc:
            self._error(400, str(exc))

    def _error(self, status: int, message: str) -> None:
        # A handler may have failed before reading the whole request body: closing the
        # connection keeps the next request on it from being parsed out of leftover bytes.
        self.close_connection = True
        self._send(status, json.dumps({"message": message}).encode(), headers={"Connection": "close"})

    def _drain(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        while length > 0:
            length -= len(self.rfile.read(min(length, 1 << 20)))

    do_GET = do_POST = do_DELETE = do_PUT = do_HEAD = _dispatch

    @property
    def committer(self) -> str:
        return self.server_state.access_key_id

    # --- repositories ---------------------------------------------------------------------------------
    def create_repository(self, query):
        body = self._body_json()
        name = body["name"]
        state = self.server_state
        store = LocalVersionedStore(state.root, name)
        with state._lock:
            if (store.repo_dir / "repository.json").exists():
                raise ApiError(409, f"repository already exists: {name}")
            if body.get("default_branch", MAIN) != MAIN:
                raise ApiError(400, "the test server supports only the default branch 'main'")
            store.ensure_repository()
            state.namespaces[name] = body["storage_namespace"]
            state.created[name] = int(time.time())
        self._json(201, self._repository_json(name))

    def _repository_json(self, name: str) -> dict:
        state = self.server_state
        return {"id": name, "creation_date": state.created.get(name, 0), "default_branch": MAIN,
                "storage_namespace": state.namespaces.get(name, f"local://{name}")}

    def get_repository(self, repo, query):
        self.server_state.repo(repo)
        self._json(200, self._repository_json(repo))

    def delete_repository(self, repo, query):
        self.server_state.repo(repo).delete_repository()
        self._send(204)

    # --- branches ---------------------------------------------------------------------------------------
    def list_branches(self, repo, query):
        branches = self.server_state.repo(repo).list_branches()
        refs = [{"id": b, "commit_id": c} for b, c in sorted(branches.items())]
        self._json(200, _page(refs, lambda r: r["id"], query))

    def create_branch(self, repo, query):
        body = self._body_json()
        store = self.server_state.repo(repo)
        if body["name"] in store.list_branches():
            raise ApiError(409, f"branch already exists: {body['name']}")
        head = store.create_branch(body["name"], body["source"])
        self._send(201, head.encode(), content_type="text/html")

    def get_branch(self, repo, branch, query):
        head = self.server_state.repo(repo).list_branches().get(branch)
        if head is None:
            raise ApiError(404, f"branch not found: {branch}")
        self._json(200, {"id": branch, "commit_id": head})

    def delete_branch(self, repo, branch, query):
        self.server_state.repo(repo).delete_branch(branch)
        self._send(204)

    def diff_branch(self, repo, branch, query):
        diffs = self.server_state.repo(repo).uncommitted_diff(branch, query.get("prefix", ""))
        rows = [{"type": d.type, "path": d.path, "path_type": "object"} for d in diffs]
        self._json(200, _page(rows, lambda r: r["path"], query))

    # --- objects -------------------------------------------------------------------------------------------
    def upload_object(self, repo, branch, query):
        store = self.server_state.repo(repo)
        if branch not in store.list_branches():
            self._drain()
            raise ApiError(404, f"branch not found: {branch}")
        path = query.get("path", "")
        if self.headers.get("Content-Type", "").startswith("multipart/"):
            self._drain()
            raise ApiError(400, "the test server accepts raw application/octet-stream uploads only")
        with tempfile.NamedTemporaryFile(dir=store.repo_dir, suffix=".upload") as tmp:
            length = int(self.headers.get("Content-Length") or 0)
            while length > 0:
                chunk = self.rfile.read(min(length, 1 << 20))
                if not chunk:
                    raise ApiError(400, "upload body ended early")
                tmp.write(chunk)
                length -= len(chunk)
            tmp.flush()
            store.put_file(branch, path, Path(tmp.name))
        self._json(201, self._stat_json(store, branch, path))

    def _stat_json(self, store: LocalVersionedStore, ref: str, path: str) -> dict:
        matches = [o for o in store.list_objects(ref, prefix=path) if o.path == path]
        if not matches:
            raise ApiError(404, f"object not found: {path}")
        return self._object_json(matches[0])

    @staticmethod
    def _object_json(info) -> dict:
        return {"path": info.path, "path_type": "object", "physical_address": f"local://objects/{info.checksum}",
                "checksum": info.checksum, "size_bytes": info.size_bytes, "mtime": int(time.time()),
                "content_type": "application/octet-stream", "metadata": {}}

    def stat_object(self, repo, ref, query):
        store = self.server_state.repo(repo)
        store.resolve_ref(ref)
        self._json(200, self._stat_json(store, ref, query.get("path", "")))

    def list_objects(self, repo, ref, query):
        if query.get("delimiter"):
            raise ApiError(400, "the test server lists flat only: pass delimiter=''")
        infos = self.server_state.repo(repo).list_objects(ref, prefix=query.get("prefix", ""))
        self._json(200, _page([self._object_json(i) for i in infos], lambda r: r["path"], query))

    def get_object(self, repo, ref, query):
        store = self.server_state.repo(repo)
        self._send_object(store.object_file(ref, query.get("path", "")))

    def _send_object(self, file: Path) -> None:
        size = file.stat().st_size
        start, end, status, headers = 0, size - 1, 200, {"ETag": f'"{file.name}"'}
        range_header = self.headers.get("Range")
        if range_header and (m := re.fullmatch(r"bytes=(\d+)-(\d*)", range_header)):
            start = int(m.group(1))
            end = min(int(m.group(2)) if m.group(2) else size - 1, size - 1)
            if start >= size:
                raise ApiError(416, "requested range not satisfiable")
            status, headers = 206, {"Content-Range": f"bytes {start}-{end}/{size}"}
        length = max(0, end - start + 1)
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command == "HEAD":
            return
        # Streamed in chunks: a test server must not hold whole objects in memory either.
        with open(file, "rb") as f:
            f.seek(start)
            while length > 0:
                chunk = f.read(min(length, 1 << 20))
                if not chunk:
                    break
                self.wfile.write(chunk)
                length -= len(chunk)

    def delete_object(self, repo, branch, query):
        store = self.server_state.repo(repo)
        if branch not in store.list_branches():
            raise ApiError(404, f"branch not found: {branch}")
        path = query.get("path", "")
        if store.exists(branch, path):  # lakeFS answers 204 for a path that is not there, too
            store.delete_object(branch, path)
        self._send(204)

    # --- commits, log, diff, merge --------------------------------------------------------------------------
    def commit(self, repo, branch, query):
        body = self._body_json()
        store = self.server_state.repo(repo)
        if not store.has_uncommitted_changes(branch) and not body.get("allow_empty"):
            raise ApiError(400, "commit: no changes")
        commit = store.commit(branch, body["message"], body.get("metadata") or {}, allow_empty=True)
        self._json(201, _commit_json(commit, self.committer))

    def get_commit(self, repo, ref, query):
        self._json(200, _commit_json(self.server_state.repo(repo).get_commit(ref), self.committer))

    def log_commits(self, repo, ref, query):
        commits = self.server_state.repo(repo).log(ref, limit=10**9)
        rows = [_commit_json(c, self.committer) for c in commits]
        after = query.get("after", "")
        if after:
            ids = [r["id"] for r in rows]
            rows = rows[ids.index(after) + 1:] if after in ids else []
        amount = int(query.get("amount") or 100)
        chosen = rows[:amount]
        has_more = len(rows) > amount
        self._json(200, {"pagination": {"has_more": has_more, "next_offset": chosen[-1]["id"] if has_more else "",
                                        "results": len(chosen), "max_per_page": 1000},
                         "results": chosen})

    def diff_refs(self, repo, left, right, query):
        store = self.server_state.repo(repo)
        prefix = query.get("prefix", "")
        if query.get("type", "three_dot") == "two_dot":
            diffs = store.diff(left, right, prefix)
        else:
            diffs = store.compare(left, right, prefix)
        rows = [{"type": d.type, "path": d.path, "path_type": "object"} for d in diffs]
        self._json(200, _page(rows, lambda r: r["path"], query))

    def merge(self, repo, source, destination, query):
        body = self._body_json()
        store = self.server_state.repo(repo)
        if store.has_uncommitted_changes(destination):
            raise ApiError(400, f"{destination}: uncommitted changes (dirty branch)")
        before = store.resolve_ref(destination)
        # lakeFS always records a merge commit, with the strategy in its metadata.
        metadata = {**(body.get("metadata") or {}), MERGE_STRATEGY_KEY: body.get("strategy") or "default"}
        message = body.get("message") or f"Merge '{source}' into '{destination}'"
        head = store.merge(source, destination, message=message, metadata=metadata)
        if head == before:
            raise ApiError(400, "no changes")
        self._json(200, {"reference": head})

    # --- tags ----------------------------------------------------------------------------------------------------
    def list_tags(self, repo, query):
        tags = self.server_state.repo(repo).list_tags()
        refs = [{"id": t, "commit_id": c} for t, c in sorted(tags.items())]
        self._json(200, _page(refs, lambda r: r["id"], query))

    def create_tag(self, repo, query):
        body = self._body_json()
        store = self.server_state.repo(repo)
        if body["id"] in store.list_tags():
            raise ApiError(409, f"tag already exists: {body['id']}")
        commit = store.create_tag(body["id"], body["ref"])
        self._json(201, {"id": body["id"], "commit_id": commit})

    def get_tag(self, repo, tag, query):
        commit = self.server_state.repo(repo).list_tags().get(tag)
        if commit is None:
            raise ApiError(404, f"tag not found: {tag}")
        self._json(200, {"id": tag, "commit_id": commit})

    def delete_tag(self, repo, tag, query):
        self.server_state.repo(repo).delete_tag(tag)
        self._send(204)

    # --- S3 gateway (read only) ------------------------------------------------------------------------------------
    def _s3_gateway(self, path: str) -> None:
        parts = unquote(path).lstrip("/").split("/", 2)
        if self.command not in ("GET", "HEAD") or len(parts) != 3:
            self._send(501, b"<Error><Code>NotImplemented</Code></Error>", content_type="application/xml")
            return
        repo, ref, key = parts
        try:
            file = self.server_state.repo(repo).object_file(ref, key)
        except (ApiError, StoreError):
            self._send(404, b"<Error><Code>NoSuchKey</Code></Error>", content_type="application/xml")
            return
        self._send_object(file)


_SEG = r"([^/]+)"
ROUTES = [
    (method, re.compile(pattern), handler)
    for method, pattern, handler in [
        ("POST", r"/repositories", _Handler.create_repository),
        ("GET", rf"/repositories/{_SEG}", _Handler.get_repository),
        ("DELETE", rf"/repositories/{_SEG}", _Handler.delete_repository),
        ("GET", rf"/repositories/{_SEG}/branches", _Handler.list_branches),
        ("POST", rf"/repositories/{_SEG}/branches", _Handler.create_branch),
        ("GET", rf"/repositories/{_SEG}/branches/{_SEG}", _Handler.get_branch),
        ("DELETE", rf"/repositories/{_SEG}/branches/{_SEG}", _Handler.delete_branch),
        ("GET", rf"/repositories/{_SEG}/branches/{_SEG}/diff", _Handler.diff_branch),
        ("POST", rf"/repositories/{_SEG}/branches/{_SEG}/commits", _Handler.commit),
        ("POST", rf"/repositories/{_SEG}/branches/{_SEG}/objects", _Handler.upload_object),
        ("DELETE", rf"/repositories/{_SEG}/branches/{_SEG}/objects", _Handler.delete_object),
        ("GET", rf"/repositories/{_SEG}/commits/{_SEG}", _Handler.get_commit),
        ("GET", rf"/repositories/{_SEG}/refs/{_SEG}/commits", _Handler.log_commits),
        ("GET", rf"/repositories/{_SEG}/refs/{_SEG}/objects", _Handler.get_object),
        ("GET", rf"/repositories/{_SEG}/refs/{_SEG}/objects/stat", _Handler.stat_object),
        ("GET", rf"/repositories/{_SEG}/refs/{_SEG}/objects/ls", _Handler.list_objects),
        ("GET", rf"/repositories/{_SEG}/refs/{_SEG}/diff/{_SEG}", _Handler.diff_refs),
        ("POST", rf"/repositories/{_SEG}/refs/{_SEG}/merge/{_SEG}", _Handler.merge),
        ("GET", rf"/repositories/{_SEG}/tags", _Handler.list_tags),
        ("POST", rf"/repositories/{_SEG}/tags", _Handler.create_tag),
        ("GET", rf"/repositories/{_SEG}/tags/{_SEG}", _Handler.get_tag),
        ("DELETE", rf"/repositories/{_SEG}/tags/{_SEG}", _Handler.delete_tag),
    ]
]

