"""A Hub-API-compatible HTTP server on loopback, for testing push and pull with the real Hub clients.

It implements what `huggingface_hub` 2.x and `transformers` 5.x send when pushing and loading a model repo (see
`docs/guides/sharing.md`): repo creation, preupload, ndjson commits, branches, model info, tree listings and file
resolution, with private repos and the error headers the clients turn into their typed exceptions. Every commit is an
immutable snapshot (path -> blob) keyed by its sha, so any earlier revision stays loadable. File contents are stored
on disk in a temporary directory, addressed by their git blob sha1 (the ETag the Hub sends for regular files).

Only model repos are served, and every upload is "regular" (base64 inside the commit): huggingface_hub 2.x uploads
LFS files through the xet protocol, which this server does not speak.
"""

import base64
import hashlib
import itertools
import json
import re
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit


DEFAULT_BRANCH = "main"
SHA = re.compile(r"[0-9a-f]{40}")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class HubError(Exception):
    """An error answer: status, the `X-Error-Code` the clients dispatch on, and a message."""

    def __init__(self, status: int, message: str, code: str | None = None, headers: dict | None = None, **body):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}
        # More fields of the JSON answer, e.g. the existing repo's "url" that create_repo(exist_ok=True) reads.
        self.body = body


def blob_sha(content: bytes) -> str:
    """The git blob sha1 of `content`: what the Hub sends as the ETag of a regular file."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


@dataclass
class Repo:
    owner: str
    private: bool
    # branch name -> commit sha
    branches: dict[str, str] = field(default_factory=dict)
    # commit sha -> {path: blob sha}; never modified once written
    commits: dict[str, dict[str, str]] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)


class HubServer:
    """Serve the Hub API on `127.0.0.1` (a free port) from a background thread.

    `tokens` maps each accepted token to its user name. A connection that stalls mid-request (a body shorter than its
    Content-Length) for `stall_timeout` seconds gets a 400 and is closed; so is one idle that long between requests.
    Use as a context manager, or call `start()` and `stop()`.
    """

    def __init__(self, tokens: dict[str, str], stall_timeout: float = 30.0):
        self.tokens = dict(tokens)
        self.stall_timeout = stall_timeout
        self.repos: dict[str, Repo] = {}
        self.lock = threading.Lock()
        self._commit_counter = itertools.count()
        self._data_dir: Path | None = None
        self._httpd: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "HubServer":
        self._data_dir = Path(tempfile.mkdtemp(prefix="hf_recurrence_hub_"))
        handler = type("BoundHubRequestHandler", (HubRequestHandler,), {"hub": self, "timeout": self.stall_timeout})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, name="hub-server", daemon=True).start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        shutil.rmtree(self._data_dir, ignore_errors=True)

    def __enter__(self) -> "HubServer":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # Storage

    def blob_path(self, sha: str) -> Path:
        return self._data_dir / "blobs" / sha

    def store_blob(self, content: bytes) -> str:
        sha = blob_sha(content)
        path = self.blob_path(sha)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = path.with_suffix(f".{threading.get_ident()}.tmp")
            temporary.write_bytes(content)
            temporary.replace(path)
        return sha

    def new_commit(self, repo: Repo, branch: str, tree: dict[str, str], summary: str) -> str:
        """Record `tree` as a new commit on `branch` (caller holds the lock) and return its sha."""
        parent = repo.branches.get(branch, "")
        seed = json.dumps([parent, sorted(tree.items()), summary, next(self._commit_counter)])
        sha = hashlib.sha1(seed.encode()).hexdigest()
        repo.commits[sha] = dict(tree)
        repo.branches[branch] = sha
        return sha


class HubRequestHandler(BaseHTTPRequestHandler):
    """One connection. Keep-alive safe: every request body is read in full before answering."""

    protocol_version = "HTTP/1.1"
    hub: HubServer

    def log_message(self, format, *args) -> None:
        # The test output stays readable; failures surface through the clients' exceptions.
        pass

    def do_GET(self):
        self.dispatch("GET")

    def do_HEAD(self):
        self.dispatch("HEAD")

    def do_POST(self):
        self.dispatch("POST")

    def do_PUT(self):
        self.dispatch("PUT")

    def do_DELETE(self):
        self.dispatch("DELETE")

    # Plumbing

    def dispatch(self, method: str) -> None:
        try:
            body = self.read_body()
        except HubError as error:
            # The stream position is unknown after a broken body: answer, then drop the connection.
            self.close_connection = True
            self.send_error_answer(error)
            return
        try:
            self.route(method, body)
        except HubError as error:
            self.send_error_answer(error)

    def read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            return self.read_chunked_body()
        length = self.headers.get("Content-Length")
        if length is None:
            return b""
        if not length.isdigit():
            raise HubError(400, f"Invalid Content-Length: {length!r}")
        return self.read_exactly(int(length))

    def read_exactly(self, size: int) -> bytes:
        try:
            data = self.rfile.read(size)
        except TimeoutError:
            raise HubError(
                400, f"Request body stalled: its {size} bytes did not arrive within {self.timeout} s"
            ) from None
        if len(data) != size:
            raise HubError(400, f"Request body ended after {len(data)} of {size} bytes")
        return data

    def read_chunked_body(self) -> bytes:
        chunks = []
        while True:
            size_line = self.rfile.readline(1024).split(b";")[0].strip()
            try:
                size = int(size_line, 16)
            except ValueError:
                raise HubError(400, f"Invalid chunk size: {size_line!r}") from None
            chunk = self.read_exactly(size + 2)[:-2]
            if size == 0:
                return b"".join(chunks)
            chunks.append(chunk)

    def send_answer(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        headers = {"Content-Type": "application/json", **(headers or {})}
        headers.setdefault("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_json(self, payload, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self.send_answer(status, json.dumps(payload).encode(), headers)

    def send_error_answer(self, error: HubError) -> None:
        headers = {"X-Error-Message": error.message, **error.headers}
        if error.code:
            headers["X-Error-Code"] = error.code
        self.send_json({"error": error.message, **error.body}, error.status, headers)

    def json_body(self, body: bytes) -> dict:
        try:
            payload = json.loads(body or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise HubError(400, f"Malformed JSON body: {error}") from None
        if not isinstance(payload, dict):
            raise HubError(400, "The JSON body must be an object")
        return payload

    @property
    def base_url(self) -> str:
        # The clients check that returned URLs start with their own endpoint, so echo the Host they used.
        return f"http://{self.headers.get('Host', '127.0.0.1')}"

    # Authentication and access

    def user(self) -> str | None:
        """The user the request's token belongs to, None when anonymous; an unknown token is a 401."""
        authorization = self.headers.get("Authorization", "")
        if not authorization:
            return None
        token = authorization.removeprefix("Bearer ").strip()
        if token not in self.hub.tokens:
            raise HubError(401, "Invalid credentials in Authorization header")
        return self.hub.tokens[token]

    def readable_repo(self, repo_id: str) -> Repo:
        """The repo, or the error the Hub gives: private repos are hidden as not found (401 when anonymous)."""
        user = self.user()
        repo = self.hub.repos.get(repo_id)
        if repo is None or (repo.private and user != repo.owner):
            status = 401 if user is None else 404
            raise HubError(status, "Repository not found", "RepoNotFound")
        return repo

    def writable_repo(self, repo_id: str) -> Repo:
        repo = self.readable_repo(repo_id)
        if self.user() != repo.owner:
            raise HubError(403, f"You don't have the rights to write to {repo_id}")
        return repo

    def resolve_revision(self, repo: Repo, revision: str) -> str:
        if revision in repo.branches:
            return repo.branches[revision]
        if SHA.fullmatch(revision) and revision in repo.commits:
            return revision
        raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")

    # Routing

    def route(self, method: str, body: bytes) -> None:
        url = urlsplit(self.path)
        # Split before unquoting: a revision such as "refs%2Fpr%2F1" is one segment.
        parts = [unquote(part) for part in url.path.strip("/").split("/")]
        query = parse_qs(url.query)
        if parts[:1] == ["api"]:
            self.route_api(method, parts[1:], body, query)
        elif len(parts) >= 5 and parts[2] == "resolve" and method in ("GET", "HEAD"):
            self.resolve_file(f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]))
        else:
            raise HubError(404, f"Not found: {method} {url.path}")

    def route_api(self, method: str, parts: list[str], body: bytes, query: dict) -> None:
        if method == "GET" and parts == ["whoami-v2"]:
            return self.whoami()
        if method == "POST" and parts == ["validate-yaml"]:
            self.json_body(body)
            return self.send_json({"errors": [], "warnings": []})
        if method == "POST" and parts == ["repos", "create"]:
            return self.create_repo(self.json_body(body))
        if method == "DELETE" and parts == ["repos", "delete"]:
            return self.delete_repo(self.json_body(body))
        if len(parts) < 3 or parts[0] != "models":
            raise HubError(404, f"Not found: {method} /api/{'/'.join(parts)}")
        repo_id, rest = f"{parts[1]}/{parts[2]}", parts[3:]
        if method == "GET" and not rest:
            return self.model_info(repo_id, DEFAULT_BRANCH)
        if method == "GET" and len(rest) == 2 and rest[0] == "revision":
            return self.model_info(repo_id, rest[1])
        if method == "GET" and len(rest) >= 2 and rest[0] == "tree":
            return self.list_tree(repo_id, rest[1], "/".join(rest[2:]), query.get("recursive") == ["true"])
        if method == "POST" and len(rest) == 2 and rest[0] == "preupload":
            return self.preupload(repo_id, rest[1], self.json_body(body))
        if method == "POST" and len(rest) == 2 and rest[0] == "commit":
            return self.commit(repo_id, rest[1], body, query)
        if method == "POST" and len(rest) == 2 and rest[0] == "branch":
            return self.create_branch(repo_id, rest[1], self.json_body(body))
        raise HubError(404, f"Not found: {method} /api/models/{repo_id}/{'/'.join(rest)}")

    # Endpoints

    def whoami(self) -> None:
        user = self.user()
        if user is None:
            raise HubError(401, "Invalid credentials in Authorization header")
        self.send_json({"type": "user", "name": user, "orgs": [], "auth": {"accessToken": {"role": "write"}}})

    def create_repo(self, payload: dict) -> None:
        user = self.user()
        if user is None:
            raise HubError(401, "You must be authenticated to create a repo")
        if payload.get("type", "model") != "model":
            raise HubError(400, f"Only model repos are served, not {payload.get('type')!r}")
        name, namespace = payload.get("name"), payload.get("organization") or user
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise HubError(400, f"Invalid repo name: {name!r}")
        if namespace != user:
            raise HubError(403, f"You don't have the rights to create a repo under {namespace}")
        repo_id = f"{namespace}/{name}"
        with self.hub.lock:
            if repo_id in self.hub.repos:
                raise HubError(409, "You already created this model repo", url=f"{self.base_url}/{repo_id}")
            # huggingface_hub 2.x sends "visibility"; older clients sent "private".
            private = payload.get("visibility", "private" if payload.get("private") else "public") != "public"
            repo = Repo(owner=user, private=private)
            content = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
            gitattributes = self.hub.store_blob(content)
            repo.sizes[gitattributes] = len(content)
            self.hub.new_commit(repo, DEFAULT_BRANCH, {".gitattributes": gitattributes}, "initial commit")
            self.hub.repos[repo_id] = repo
        self.send_json({"url": f"{self.base_url}/{repo_id}", "name": repo_id})

    def delete_repo(self, payload: dict) -> None:
        repo_id = f"{payload.get('organization') or self.user()}/{payload.get('name')}"
        with self.hub.lock:
            self.writable_repo(repo_id)
            del self.hub.repos[repo_id]
        self.send_answer(200)

    def model_info(self, repo_id: str, revision: str) -> None:
        repo = self.readable_repo(repo_id)
        with self.hub.lock:
            sha = self.resolve_revision(repo, revision)
            tree = repo.commits[sha]
        self.send_json(
            {
                "id": repo_id,
                "modelId": repo_id,
                "author": repo.owner,
                "sha": sha,
                "private": repo.private,
                "gated": False,
                "disabled": False,
                "tags": [],
                "siblings": [{"rfilename": path} for path in sorted(tree)],
            }
        )

    def list_tree(self, repo_id: str, revision: str, folder: str, recursive: bool) -> None:
        repo = self.readable_repo(repo_id)
        with self.hub.lock:
            tree = repo.commits[self.resolve_revision(repo, revision)]
        prefix = f"{folder.strip('/')}/" if folder.strip("/") else ""
        entries, folders = [], set()
        for path, sha in sorted(tree.items()):
            if not path.startswith(prefix):
                continue
            relative = path[len(prefix) :].split("/")
            for depth in range(1, len(relative)):
                folders.add("/".join([prefix.rstrip("/"), *relative[:depth]]).strip("/"))
            if recursive or len(relative) == 1:
                entries.append({"type": "file", "oid": sha, "size": repo.sizes[sha], "path": path})
        if prefix and not entries and not folders:
            raise HubError(404, f"Folder {folder} not found", "EntryNotFound")
        # A folder's oid is a stable stand-in for the git tree sha the Hub sends; the clients only pass it through.
        for path in sorted(folders):
            if recursive or path.count("/") == prefix.count("/"):
                entries.append({"type": "directory", "oid": blob_sha(path.encode()), "size": 0, "path": path})
        self.send_json(entries)

    def resolve_file(self, repo_id: str, revision: str, path: str) -> None:
        repo = self.readable_repo(repo_id)
        with self.hub.lock:
            commit = self.resolve_revision(repo, revision)
            sha = repo.commits[commit].get(path)
        if sha is None:
            # transformers probes optional files (adapter_config.json, ...) and expects exactly this answer.
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound", headers={"X-Repo-Commit": commit})
        content = b"" if self.command == "HEAD" else self.hub.blob_path(sha).read_bytes()
        headers = {
            "Content-Type": "application/octet-stream",
            "Content-Length": str(repo.sizes[sha]),
            "ETag": f'"{sha}"',
            "X-Repo-Commit": commit,
        }
        self.send_answer(200, content, headers)

    def preupload(self, repo_id: str, revision: str, payload: dict) -> None:
        repo = self.writable_repo(repo_id)
        files = payload.get("files")
        if not isinstance(files, list) or not all(isinstance(f, dict) and "path" in f for f in files):
            raise HubError(400, "preupload expects {'files': [{'path', 'sample', 'size'}, ...]}")
        with self.hub.lock:
            tree = repo.commits[self.resolve_revision(repo, revision)]
        answer = [
            {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": tree.get(f["path"])}
            for f in files
        ]
        self.send_json({"files": answer, "commitOid": repo.branches.get(revision)})

    def commit(self, repo_id: str, revision: str, body: bytes, query: dict) -> None:
        repo = self.writable_repo(repo_id)
        if query.get("create_pr") == ["1"]:
            raise HubError(400, "Pull requests are not served by this test Hub")
        header, additions, deletions = self.parse_commit(body)
        with self.hub.lock:
            if revision not in repo.branches:
                raise HubError(404, f"Invalid rev id: {revision} is not a branch", "RevisionNotFound")
            parent = header.get("parentCommit")
            if parent is not None and parent != repo.branches[revision]:
                raise HubError(412, f"A commit has happened on {revision} since {parent}")
            tree = dict(repo.commits[repo.branches[revision]])
            for path, is_folder in deletions:
                removed = [p for p in tree if p == path or (is_folder and p.startswith(path.rstrip("/") + "/"))]
                for p in removed:
                    del tree[p]
            for path, content in additions.items():
                tree[path] = self.hub.store_blob(content)
                repo.sizes[tree[path]] = len(content)
            sha = self.hub.new_commit(repo, revision, tree, header.get("summary", ""))
        self.send_json({"commitOid": sha, "commitUrl": f"{self.base_url}/{repo_id}/commit/{sha}"})

    def parse_commit(self, body: bytes) -> tuple[dict, dict[str, bytes], list[tuple[str, bool]]]:
        header, additions, deletions = None, {}, []
        for number, line in enumerate(body.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                key, value = item["key"], item["value"]
                if key == "header":
                    header = dict(value)
                elif key == "file":
                    if value.get("encoding") != "base64":
                        raise ValueError(f"unsupported encoding {value.get('encoding')!r}")
                    additions[value["path"]] = base64.b64decode(value["content"], validate=True)
                elif key in ("deletedFile", "deletedFolder"):
                    deletions.append((value["path"], key == "deletedFolder"))
                else:
                    raise ValueError(f"unsupported operation {key!r} (only regular uploads are served)")
            except (ValueError, KeyError, TypeError) as error:
                raise HubError(400, f"Malformed commit line {number}: {error}") from None
        if header is None:
            raise HubError(400, "A commit needs a header line")
        return header, additions, deletions

    def create_branch(self, repo_id: str, branch: str, payload: dict) -> None:
        repo = self.writable_repo(repo_id)
        if not NAME.fullmatch(branch):
            raise HubError(400, f"Invalid branch name: {branch!r}")
        with self.hub.lock:
            if branch in repo.branches:
                raise HubError(409, f"Branch {branch} already exists")
            start = self.resolve_revision(repo, payload.get("startingPoint") or DEFAULT_BRANCH)
            repo.branches[branch] = start
        self.send_answer(200, b"{}")
