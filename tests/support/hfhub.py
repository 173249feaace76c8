"""A local stand-in for the Hugging Face Hub's HTTP API, for the hf:// download paths.

No real Hub is reachable from this machine, so the real ``huggingface_hub`` client (what the build and
convert Jobs run) is pointed at this server with ``HF_ENDPOINT``. It serves model repositories from local
directories, one commit per (repo, revision), with the routes ``snapshot_download`` uses:

* ``GET /api/models/{repo}/revision/{revision}``: the commit sha and file list;
* ``GET /api/models/{repo}/tree/{sha}?recursive=...``: the files with size and blob id;
* ``HEAD``/``GET /{repo}/resolve/{revision}/{file}``: the file, with ``X-Repo-Commit`` and ``ETag``.

Unknown repos answer 404 with ``X-Error-Code: RepoNotFound``, unknown revisions 404 with
``RevisionNotFound``, as the Hub does. Private repos need ``Authorization: Bearer <token>`` (401
otherwise). Every request is recorded (method, path, authorization header).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from tests.support.loopthread import LoopThread


@dataclass(frozen=True)
class Commit:
    sha: str
    files: dict[str, bytes]


@dataclass
class HubRepo:
    commits: dict[str, Commit] = field(default_factory=dict)  # by sha
    refs: dict[str, str] = field(default_factory=dict)  # branch -> sha
    token: str | None = None  # private: this bearer token is required


def commit_of(directory: Path, salt: str = "") -> Commit:
    files = {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}
    digest = hashlib.sha1(salt.encode())
    for name, data in files.items():
        digest.update(name.encode() + b"\0" + hashlib.sha1(data).digest())
    return Commit(digest.hexdigest(), files)


class HubEmulator:
    def __init__(self) -> None:
        self.repos: dict[str, HubRepo] = {}
        self.requests: list[tuple[str, str, str | None]] = []
        self.url = ""

    def add(self, repo_id: str, directory: Path, *, branch: str = "main", token: str | None = None) -> str:
        """Publish ``directory`` as a new commit of ``repo_id`` on ``branch``; returns the commit sha."""
        repo = self.repos.setdefault(repo_id, HubRepo(token=token))
        commit = commit_of(directory, salt=f"{repo_id}@{len(repo.commits)}")
        repo.commits[commit.sha] = commit
        repo.refs[branch] = commit.sha
        return commit.sha

    # -- HTTP ------------------------------------------------------------------------------------------
    def _lookup(self, request: web.Request, repo_id: str, revision: str) -> Commit:
        repo = self.repos.get(repo_id)
        if repo is None:
            raise web.HTTPNotFound(headers={"X-Error-Code": "RepoNotFound"}, text="Repository not found")
        if repo.token is not None and request.headers.get("Authorization") != f"Bearer {repo.token}":
            raise web.HTTPUnauthorized(headers={"X-Error-Code": "RepoNotFound"}, text="Invalid credentials")
        sha = repo.refs.get(revision, revision)
        commit = repo.commits.get(sha)
        if commit is None:
            raise web.HTTPNotFound(headers={"X-Error-Code": "RevisionNotFound"}, text="Invalid rev id")
        return commit

    @web.middleware
    async def _record(self, request: web.Request, handler: web.RequestHandler) -> web.StreamResponse:
        self.requests.append((request.method, request.path, request.headers.get("Authorization")))
        return await handler(request)  # type: ignore[no-any-return]

    async def _revision(self, request: web.Request) -> web.Response:
        repo_id, revision = request.match_info["repo"], request.match_info["revision"]
        commit = self._lookup(request, repo_id, revision)
        siblings = [{"rfilename": name} for name in commit.files]
        return web.json_response({"id": repo_id, "modelId": repo_id, "sha": commit.sha, "siblings": siblings})

    async def _tree(self, request: web.Request) -> web.Response:
        commit = self._lookup(request, request.match_info["repo"], request.match_info["revision"])
        entries = [
            {"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
            for name, data in commit.files.items()
        ]
        return web.json_response(entries)

    async def _resolve(self, request: web.Request) -> web.Response:
        repo_id, revision, name = (request.match_info[k] for k in ("repo", "revision", "file"))
        commit = self._lookup(request, repo_id, revision)
        data = commit.files.get(name)
        if data is None:
            raise web.HTTPNotFound(headers={"X-Error-Code": "EntryNotFound"}, text="Entry not found")
        headers = {"X-Repo-Commit": commit.sha, "ETag": f'"{hashlib.sha1(data).hexdigest()}"'}
        if request.method == "HEAD":
            headers["Content-Length"] = str(len(data))
            return web.Response(headers=headers)
        return web.Response(body=data, headers=headers, content_type="application/octet-stream")

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._record])
        app.add_routes(
            [
                web.get("/api/models/{repo:[^/]+/[^/]+}/revision/{revision}", self._revision),
                web.get("/api/models/{repo:[^/]+/[^/]+}/tree/{revision}", self._tree),
                web.route("HEAD", "/{repo:[^/]+/[^/]+}/resolve/{revision}/{file:.+}", self._resolve),
                web.get("/{repo:[^/]+/[^/]+}/resolve/{revision}/{file:.+}", self._resolve, allow_head=False),
            ]
        )
        return app


@contextmanager
def running_hub() -> Iterator[HubEmulator]:
    """A :class:`HubEmulator` served on a loopback port from a background event loop."""
    hub = HubEmulator()
    loop = LoopThread()
    runner = web.AppRunner(hub.app(), access_log=None)

    async def start() -> str:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return site.name  # http://127.0.0.1:PORT

    try:
        hub.url = loop.run(start(), timeout_s=10)
        yield hub
    finally:
        loop.run(runner.cleanup(), timeout_s=10)
        loop.close()
