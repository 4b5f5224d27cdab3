"""The lakeFS test server answers as lakeFS does where a client could be fooled: request bodies
sent in chunks, requests with no length, the commit log's ``limit``, and reads past the end.
lakeFS's own wrapper tests (tests/store/lakefs_conformance) check the rest."""

from __future__ import annotations

import base64
import http.client
import json
import socket
from urllib.parse import urlencode, urlparse

import lakefs_sdk
import pytest
from lakefs_sdk.client import LakeFSClient

from resources.store.base import MAIN
from tests.support.lakefs_server import LakeFSTestServer
from tests.support.store_backends import fresh_repository_name


@pytest.fixture
def repo(lakefs_server: LakeFSTestServer) -> str:
    name = fresh_repository_name()
    sdk(lakefs_server).repositories_api.create_repository(
        lakefs_sdk.RepositoryCreation(name=name, storage_namespace=f"local://{name}"))
    return name


def sdk(server: LakeFSTestServer) -> LakeFSClient:
    return LakeFSClient(lakefs_sdk.Configuration(host=f"{server.direct_endpoint}/api/v1",
                                                 username=server.access_key_id, password=server.secret_access_key))


def raw_request(server: LakeFSTestServer, head: str, body: bytes = b"") -> tuple[int, dict]:
    """One request written byte for byte to the server itself (no proxy, no client library)."""
    url = urlparse(server.direct_endpoint)
    auth = base64.b64encode(f"{server.access_key_id}:{server.secret_access_key}".encode()).decode()
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        sock.sendall(head.replace("{auth}", auth).encode() + body)
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, json.loads(response.read() or b"{}")


def upload_head(repo: str, path: str, headers: str) -> str:
    query = urlencode({"path": path})
    return (f"POST /api/v1/repositories/{repo}/branches/{MAIN}/objects?{query} HTTP/1.1\r\n"
            f"Host: lakefs\r\nAuthorization: Basic {{auth}}\r\nContent-Type: application/octet-stream\r\n"
            f"{headers}Connection: close\r\n\r\n")


def test_a_chunked_upload_is_stored_whole(lakefs_server, repo):
    parts = [b"first chunk;", b"x" * 70_000, b"last"]
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
    status, stats = raw_request(lakefs_server, upload_head(repo, "chunked.bin", "Transfer-Encoding: chunked\r\n"),
                                chunked)
    assert (status, stats["size_bytes"]) == (201, sum(map(len, parts)))
    data = sdk(lakefs_server).objects_api.get_object(repo, MAIN, "chunked.bin")
    assert bytes(data) == b"".join(parts)


def test_an_upload_without_a_length_is_refused_and_stores_nothing(lakefs_server, repo):
    status, answer = raw_request(lakefs_server, upload_head(repo, "nolength.bin", ""), b"bytes nobody counted")
    assert status == 411 and "Content-Length" in answer["message"]
    with pytest.raises(lakefs_sdk.exceptions.NotFoundException):
        sdk(lakefs_server).objects_api.stat_object(repo, MAIN, "nolength.bin")


def test_the_log_pages_as_lakefs_pages(lakefs_server, repo):
    """pkg/catalog/catalog.go ListCommits: limit=true stops at amount and says no more."""
    client = sdk(lakefs_server)
    for i in range(11):
        client.commits_api.commit(repo, MAIN, lakefs_sdk.CommitCreation(message=f"c{i}", allow_empty=True))
    limited = client.refs_api.log_commits(repo, MAIN, amount=10, limit=True)
    assert (len(limited.results), limited.pagination.has_more) == (10, False)
    first = client.refs_api.log_commits(repo, MAIN, amount=10, limit=False)
    assert (len(first.results), first.pagination.has_more) == (10, True)
    assert first.pagination.next_offset == first.results[-1].id
    rest = client.refs_api.log_commits(repo, MAIN, amount=10, after=first.pagination.next_offset)
    assert [c.message for c in rest.results] == ["c0", "Repository created"] and not rest.pagination.has_more


def test_a_read_past_the_end_says_how_long_the_object_is(lakefs_server, repo):
    client = sdk(lakefs_server)
    status, _ = raw_request(lakefs_server, upload_head(repo, "five.bin", "Content-Length: 5\r\n"), b"12345")
    assert status == 201
    assert bytes(client.objects_api.get_object(repo, MAIN, "five.bin", range="bytes=1-2")) == b"23"
    with pytest.raises(lakefs_sdk.exceptions.ApiException) as info:
        client.objects_api.get_object(repo, MAIN, "five.bin", range="bytes=5-")
    assert info.value.status == 416 and info.value.headers["Content-Range"] == "bytes */5"
