"""The test Hub answers bad requests with 4xx, keeps serving, and gives the errors the clients expect."""

import base64
import http.client
import json
import socket
from urllib.parse import urlsplit

import pytest
from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub.errors import (
    BadRequestError,
    HfHubHTTPError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from ..conftest import ALICE_TOKEN, BOB_TOKEN
from .server import HubServer, blob_sha


AUTH = {"Authorization": f"Bearer {ALICE_TOKEN}"}


@pytest.fixture(scope="module")
def repo_id() -> str:
    api = HfApi()
    repo_id = api.create_repo("alice/server-checks").repo_id
    api.upload_file(path_or_fileobj=b"hello\n", path_in_repo="folder/hello.txt", repo_id=repo_id)
    return repo_id


@pytest.fixture
def connection(hub_server):
    address = urlsplit(hub_server.url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=10)
    yield connection
    connection.close()


def request(connection, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    connection.request(method, path, body=body, headers={**AUTH, **(headers or {})})
    response = connection.getresponse()
    return response.status, response.getheaders(), response.read()


def assert_still_serving(connection) -> None:
    status, _, body = request(connection, "GET", "/api/whoami-v2")
    assert status == 200 and json.loads(body)["name"] == "alice"


def test_bad_requests_get_4xx_on_a_connection_that_keeps_working(connection, repo_id):
    answers = [
        request(connection, "POST", "/api/repos/create", b"{not json"),
        request(connection, "POST", "/api/repos/create", b"[1, 2]"),
        request(connection, "GET", "/no/such/path/at/all"),
        request(connection, "DELETE", "/api/unknown"),
        request(connection, "POST", f"/api/models/{repo_id}/preupload/main", b'{"files": "nope"}'),
        request(connection, "POST", f"/api/models/{repo_id}/commit/main", b"not ndjson\n"),
    ]
    assert [status for status, _, _ in answers] == [400, 400, 404, 404, 400, 400]
    assert all("error" in json.loads(body) for _, _, body in answers)
    assert_still_serving(connection)


def test_a_truncated_body_gets_400_and_the_server_keeps_serving(hub_server, connection):
    address = urlsplit(hub_server.url)
    with socket.create_connection((address.hostname, address.port), timeout=10) as raw:
        raw.sendall(
            b"POST /api/repos/create HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"name": "trunc'
        )
        raw.shutdown(socket.SHUT_WR)
        answer = raw.makefile("rb").read()
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert b"ended after 15 of 100 bytes" in answer
    assert_still_serving(connection)


def test_a_body_shorter_than_its_content_length_on_an_open_connection_gets_400():
    with HubServer({}, stall_timeout=0.5) as hub:
        address = urlsplit(hub.url)
        with socket.create_connection((address.hostname, address.port), timeout=10) as raw:
            raw.sendall(b"POST /api/validate-yaml HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{}")
            answer = raw.makefile("rb").read()
        assert answer.startswith(b"HTTP/1.1 400 ")
        assert b"Request body stalled" in answer
        connection = http.client.HTTPConnection(address.hostname, address.port, timeout=10)
        connection.request("POST", "/api/validate-yaml", body=b"{}")
        assert connection.getresponse().status == 200
        connection.close()


def test_an_invalid_content_length_gets_400(hub_server, connection):
    address = urlsplit(hub_server.url)
    with socket.create_connection((address.hostname, address.port), timeout=10) as raw:
        raw.sendall(b"POST /api/validate-yaml HTTP/1.1\r\nHost: x\r\nContent-Length: -3\r\n\r\n")
        answer = raw.makefile("rb").read()
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert_still_serving(connection)


def test_files_carry_the_headers_the_download_client_needs(connection, repo_id):
    head_status, head, _ = request(connection, "HEAD", f"/{repo_id}/resolve/main/folder/hello.txt")
    status, headers, body = request(connection, "GET", f"/{repo_id}/resolve/main/folder/hello.txt")
    assert (head_status, status, body) == (200, 200, b"hello\n")
    headers, head = dict(headers), dict(head)
    expected_etag = blob_sha(b"hello\n")
    assert headers["ETag"] == head["ETag"] == f'"{expected_etag}"'
    assert headers["Content-Length"] == head["Content-Length"] == "6"
    assert headers["X-Repo-Commit"] == HfApi().model_info(repo_id).sha


def test_typed_errors_reach_the_client(repo_id):
    api = HfApi()
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("alice/missing")
    with pytest.raises(RevisionNotFoundError):
        api.model_info(repo_id, revision="missing")
    with pytest.raises(RemoteEntryNotFoundError):
        hf_hub_download(repo_id, "missing.txt")
    with pytest.raises(HfHubHTTPError, match="409"):
        api.create_repo(repo_id)
    with pytest.raises(HfHubHTTPError, match="403"):
        HfApi(token=BOB_TOKEN).upload_file(path_or_fileobj=b"x", path_in_repo="x", repo_id=repo_id)
    with pytest.raises(HfHubHTTPError, match="Invalid credentials"):
        HfApi(token="hf_not_a_token").model_info(repo_id)


def test_a_commit_on_a_stale_parent_is_refused(connection, repo_id):
    stale = HfApi().model_info(repo_id).sha
    HfApi().upload_file(path_or_fileobj=b"new", path_in_repo="new.txt", repo_id=repo_id)
    header = {"key": "header", "value": {"summary": "late", "parentCommit": stale}}
    line = {
        "key": "file",
        "value": {"path": "late.txt", "encoding": "base64", "content": base64.b64encode(b"x").decode()},
    }
    body = b"\n".join(json.dumps(item).encode() for item in (header, line))
    status, _, _ = request(connection, "POST", f"/api/models/{repo_id}/commit/main", body)
    assert status == 412
    assert "late.txt" not in HfApi().list_repo_files(repo_id)


def test_tree_listing_and_deletions(repo_id):
    api = HfApi()
    entries = {entry.path: type(entry).__name__ for entry in api.list_repo_tree(repo_id, recursive=True)}
    assert entries["folder"] == "RepoFolder" and entries["folder/hello.txt"] == "RepoFile"
    top = {entry.path for entry in api.list_repo_tree(repo_id)}
    assert "folder" in top and "folder/hello.txt" not in top
    before = api.model_info(repo_id).sha
    api.delete_folder("folder", repo_id=repo_id)
    assert "folder/hello.txt" not in api.list_repo_files(repo_id)
    assert "folder/hello.txt" in api.list_repo_files(repo_id, revision=before)
    with pytest.raises(BadRequestError, match="Pull requests are not served"):
        api.upload_file(path_or_fileobj=b"x", path_in_repo="x", repo_id=repo_id, create_pr=True)
