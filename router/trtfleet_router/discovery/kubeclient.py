"""A small, self-contained asynchronous Kubernetes API client (aiohttp): list + watch, nothing else.

Credentials: in-cluster (service-account token, re-read on every connection because bound tokens
rotate, and the cluster CA) when ``KUBERNETES_SERVICE_HOST`` is set, else a kubeconfig (``KUBECONFIG``
or ``~/.kube/config``, its current context: server, CA file or data, client certificate/key files or
data, bearer token or token file, ``insecure-skip-tls-verify``). Inline ``*-data`` certificates are
written to private temporary files because :mod:`ssl` loads client certificates from files only.

:meth:`KubeClient.watch` yields ``(type, object)`` events forever: it lists (``SYNC`` events with the
full list, then ``ADDED``/``MODIFIED``/``DELETED``), watches from the list's resourceVersion,
and relists after ``410 Gone`` or any connection error (with capped backoff). It never blocks the
event loop: every call is aiohttp, file reads happen only when connecting.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import ssl
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import aiohttp
import yaml

log = logging.getLogger(__name__)

SA_DIR: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
WATCH_TIMEOUT_S: Final = 300
BACKOFF_INITIAL_S: Final = 0.5
BACKOFF_MAX_S: Final = 15.0
SYNC: Final = "SYNC"


class KubeError(Exception):
    """The API server could not be reached or refused a request."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class KubeCredentials:
    server: str
    ssl_context: ssl.SSLContext | bool
    token: str | None = None
    token_file: Path | None = None
    namespace: str = "default"

    def headers(self) -> dict[str, str]:
        token = self.token
        if self.token_file is not None:
            token = self.token_file.read_text(encoding="utf-8").strip()
        return {"Authorization": f"Bearer {token}"} if token else {}


def _data_file(data_b64: str, suffix: str) -> str:
    handle = tempfile.NamedTemporaryFile(prefix="trtfleet-kube-", suffix=suffix, delete=False)
    with handle:
        handle.write(base64.b64decode(data_b64))
    os.chmod(handle.name, 0o600)
    return handle.name


def in_cluster_credentials() -> KubeCredentials:
    host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    host = f"[{host}]" if ":" in host else host
    context = ssl.create_default_context(cafile=str(SA_DIR / "ca.crt"))
    namespace_file = SA_DIR / "namespace"
    namespace = namespace_file.read_text().strip() if namespace_file.exists() else "default"
    return KubeCredentials(f"https://{host}:{port}", context, token_file=SA_DIR / "token", namespace=namespace)


def kubeconfig_credentials(path: Path) -> KubeCredentials:
    config: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    current = config.get("current-context")
    contexts = {c["name"]: c.get("context", {}) for c in config.get("contexts") or []}
    if current not in contexts:
        raise KubeError(f"kubeconfig {path} has no current context")
    context = contexts[current]
    clusters = {c["name"]: c.get("cluster", {}) for c in config.get("clusters") or []}
    users = {u["name"]: u.get("user", {}) for u in config.get("users") or []}
    cluster, user = clusters.get(context.get("cluster"), {}), users.get(context.get("user"), {})
    server = cluster.get("server")
    if not server:
        raise KubeError(f"kubeconfig {path}: cluster of context {current!r} has no server")
    base = path.parent

    def resolve(name: str) -> str | None:
        if cluster_or_user := (cluster.get(name) or user.get(name)):
            candidate = Path(cluster_or_user)
            return str(candidate if candidate.is_absolute() else base / candidate)
        data = cluster.get(f"{name}-data") or user.get(f"{name}-data")
        return _data_file(data, ".pem") if data else None

    ssl_context: ssl.SSLContext | bool = True
    if server.startswith("https://"):
        if cluster.get("insecure-skip-tls-verify"):
            ssl_context = ssl.create_default_context()
            ssl_context.check_hostname = False
            ssl_context.verify_mode = ssl.CERT_NONE
        else:
            ssl_context = ssl.create_default_context(cafile=resolve("certificate-authority"))
        cert, key = resolve("client-certificate"), resolve("client-key")
        if cert and key:
            ssl_context.load_cert_chain(cert, key)
    token_file = user.get("tokenFile")
    return KubeCredentials(
        server=server.rstrip("/"),
        ssl_context=ssl_context,
        token=user.get("token"),
        token_file=Path(token_file) if token_file else None,
        namespace=context.get("namespace") or "default",
    )


def load_credentials() -> KubeCredentials:
    if os.environ.get("KUBERNETES_SERVICE_HOST") and (SA_DIR / "token").exists():
        return in_cluster_credentials()
    path = Path(os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or Path.home() / ".kube" / "config")
    return kubeconfig_credentials(path)


class KubeClient:
    def __init__(self, credentials: KubeCredentials) -> None:
        self.credentials = credentials
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self.credentials.ssl_context)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def list(self, path: str, params: dict[str, str] | None = None) -> dict[str, Any]:
        url = self.credentials.server + path
        try:
            async with self._http().get(
                url,
                params=params,
                headers=self.credentials.headers(),
                timeout=aiohttp.ClientTimeout(total=30),
            ) as response:
                if response.status != 200:
                    raise KubeError(f"GET {path}: {response.status} {await response.text()}", response.status)
                result: dict[str, Any] = await response.json()
                return result
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise KubeError(f"GET {path}: {exc}") from exc

    async def watch(self, path: str, label_selector: str | None = None) -> AsyncIterator[tuple[str, Any]]:
        """``(SYNC, [objects])`` after every (re)list, then ``(ADDED|MODIFIED|DELETED, object)``."""
        backoff_s = BACKOFF_INITIAL_S
        while True:
            params = {"labelSelector": label_selector} if label_selector else {}
            try:
                listed = await self.list(path, params)
                yield SYNC, listed.get("items") or []
                version = listed.get("metadata", {}).get("resourceVersion", "")
                backoff_s = BACKOFF_INITIAL_S
                async for kind, obj in self._watch_from(path, params, version):
                    yield kind, obj
            except KubeError as exc:
                log.warning("kubernetes watch interrupted", extra={"ctx": {"path": path, "error": str(exc)}})
                await asyncio.sleep(backoff_s)
                backoff_s = min(BACKOFF_MAX_S, backoff_s * 2)

    async def _watch_from(self, path: str, params: dict[str, str], version: str) -> AsyncIterator[tuple[str, Any]]:
        """Watch until the server closes the stream (return) or the version expires (KubeError 410)."""
        while True:
            query = {
                **params,
                "watch": "1",
                "resourceVersion": version,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": str(WATCH_TIMEOUT_S),
            }
            url = self.credentials.server + path
            try:
                async with self._http().get(
                    url,
                    params=query,
                    headers=self.credentials.headers(),
                    timeout=aiohttp.ClientTimeout(total=None, sock_read=WATCH_TIMEOUT_S + 30),
                ) as response:
                    if response.status != 200:
                        raise KubeError(f"watch {path}: {response.status}", response.status)
                    async for line in response.content:
                        if not line.strip():
                            continue
                        event = json.loads(line)
                        kind, obj = event.get("type"), event.get("object") or {}
                        if kind == "ERROR":
                            raise KubeError(f"watch {path}: {obj.get('message')}", obj.get("code"))
                        version = obj.get("metadata", {}).get("resourceVersion", version)
                        if kind != "BOOKMARK":
                            yield kind, obj
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
                raise KubeError(f"watch {path}: {exc}") from exc
