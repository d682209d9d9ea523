"""A Hugging Face hub on 127.0.0.1 for tests: the few endpoints `huggingface_hub`'s
`snapshot_download` calls, serving model repositories from memory.

    GET  /api/models/{repo}/revision/{rev}       repo info: the commit sha, the files
    GET  /api/models/{repo}/tree/{sha}[/{path}]  the file listing (one page)
    HEAD /{repo}/resolve/{rev}/{file}            X-Repo-Commit, ETag, Content-Length
    GET  /{repo}/resolve/{rev}/{file}            the bytes

A repository has one or more commits (`add(repo, files, branch)`: a new commit on the branch,
"main" by default); a revision is a branch name or a commit sha. `requests` records every
request (method, path), so a test can say that a job asked nothing of the network.
Point `HF_ENDPOINT` at `hub.url`.
"""

from __future__ import annotations

import hashlib
import json
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@dataclass
class _Repo:
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # sha -> files
    branches: dict[str, str] = field(default_factory=dict)  # name -> sha

    def files(self, revision: str) -> tuple[str, dict[str, bytes]] | None:
        sha = self.branches.get(revision, revision)
        return (sha, self.commits[sha]) if sha in self.commits else None


class LoopbackHub:
    """The server; `url` to point HF_ENDPOINT at; `close()` when done."""

    def __init__(self):
        self.repos: dict[str, _Repo] = {}
        self.requests: list[tuple[str, str]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.hub = self
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def add(self, repo: str, files: dict[str, bytes], branch: str = "main") -> str:
        """A commit of `files` on `branch` of `repo`; returns its sha."""
        sha = hashlib.sha1(repr((repo, sorted(files.items()))).encode()).hexdigest()
        entry = self.repos.setdefault(repo, _Repo())
        entry.commits[sha] = dict(files)
        entry.branches[branch] = sha
        return sha

    def add_folder(self, repo: str, folder: Path, branch: str = "main") -> str:
        """A commit of every file in `folder` (its top level)."""
        files = {p.name: p.read_bytes() for p in sorted(Path(folder).iterdir()) if p.is_file()}
        return self.add(repo, files, branch)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Handler(BaseHTTPRequestHandler):
    def _resolve(self) -> tuple[str, str, bytes] | None:
        """(sha, file, bytes) of a /{repo}/resolve/{rev}/{file} path."""
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        if "/resolve/" not in path:
            return None
        repo, rest = path.lstrip("/").split("/resolve/", 1)
        revision, _, name = rest.partition("/")
        found = self.server.hub.repos.get(repo)
        commit = found.files(revision) if found else None
        if commit is None or name not in commit[1]:
            return None
        return commit[0], name, commit[1][name]

    def _file_headers(self, sha: str, data: bytes) -> None:
        self.send_header("X-Repo-Commit", sha)
        self.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Content-Type", "application/octet-stream")

    def do_HEAD(self):  # noqa: N802 (the http.server API)
        self.server.hub.requests.append(("HEAD", self.path))
        self._file(with_body=False)

    def do_GET(self):  # noqa: N802
        self.server.hub.requests.append(("GET", self.path))
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        if path.startswith("/api/models/"):
            self._api(path.removeprefix("/api/models/"))
        else:
            self._file(with_body=True)

    def _file(self, with_body: bool) -> None:
        """A /{repo}/resolve/{rev}/{file}: its headers, and its bytes for a GET."""
        found = self._resolve()
        if found is None:
            self._not_found()
            return
        self.send_response(200)
        self._file_headers(found[0], found[2])
        self.end_headers()
        if with_body:
            self.wfile.write(found[2])

    def _api(self, rest: str) -> None:
        for marker in ("/revision/", "/tree/"):
            if marker in rest:
                repo, revision = rest.split(marker, 1)
                break
        else:
            repo, revision, marker = rest, "main", "/revision/"
        revision = revision.split("/", 1)[0]
        found = self.server.hub.repos.get(repo)
        commit = found.files(revision) if found else None
        if commit is None:
            self._not_found(repo_missing=found is None)
            return
        sha, files = commit
        if marker == "/revision/":
            body = {"id": repo, "modelId": repo, "sha": sha, "private": False,
                    "siblings": [{"rfilename": name} for name in sorted(files)]}  # fmt: skip
        else:
            body = [{"type": "file", "path": name, "size": len(data),
                     "oid": hashlib.sha1(data).hexdigest()}
                    for name, data in sorted(files.items())]  # fmt: skip
        payload = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _not_found(self, repo_missing: bool = True) -> None:
        payload = b'{"error": "Repository not found"}'
        self.send_response(404)
        # huggingface_hub tells a missing repository from a missing file by this header
        self.send_header("X-Error-Code", "RepoNotFound" if repo_missing else "RevisionNotFound")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def log_message(self, *args):
        pass
