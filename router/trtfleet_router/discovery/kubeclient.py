"""List + watch for the router's discovery, over the shared client :class:`trtfleet.kube.KubeApi`.

Credentials and TLS are wholly the shared layer's (:mod:`trtfleet.kube.config`: kubeconfig contexts,
exec plugins, client certificates, tokens, the in-cluster service account with token rotation).

:meth:`KubeClient.watch` yields ``(type, object)`` events forever: it lists (``SYNC`` events with the
full list, then ``ADDED``/``MODIFIED``/``DELETED``), watches from the list's resourceVersion,
and relists after ``410 Gone`` or any connection error (with capped backoff). It never blocks the
event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any, Final

from trtfleet.kube import KubeApi, KubeApiError, KubeConnection, KubeSource

log = logging.getLogger(__name__)

WATCH_TIMEOUT_S: Final = 300
WATCH_READ_GRACE_S: Final = 30
BACKOFF_INITIAL_S: Final = 0.5
BACKOFF_MAX_S: Final = 15.0
SYNC: Final = "SYNC"


class KubeError(Exception):
    """The API server could not be reached or refused a request."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class KubeClient:
    """The API server of ``connection`` (loaded before the event loop starts, so a bad kubeconfig fails
    at start-up); the library's session is opened on first use inside the loop."""

    def __init__(self, source: KubeSource, connection: KubeConnection) -> None:
        self.source = source
        self.connection = connection
        self._api: KubeApi | None = None

    @property
    def namespace(self) -> str:
        return self.connection.namespace

    def api(self) -> KubeApi:
        """The shared client, opened on first use (inside the event loop)."""
        if self._api is None:
            self._api = KubeApi(self.source, self.connection)
        return self._api

    async def close(self) -> None:
        if self._api is not None:
            await self._api.close()
            self._api = None

    async def list(self, path: str, params: dict[str, str] | None = None) -> dict[str, Any]:
        try:
            return await self.api().request("GET", path, params=params)
        except KubeApiError as exc:
            raise KubeError(f"GET {path}: {exc}", exc.status or None) from exc

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
            stream = self.api().stream(path, query, read_timeout_s=WATCH_TIMEOUT_S + WATCH_READ_GRACE_S)
            try:
                async with contextlib.aclosing(stream):
                    async for event in stream:
                        kind, obj = str(event.get("type")), event.get("object") or {}
                        if kind == "ERROR":
                            raise KubeError(f"watch {path}: {obj.get('message')}", obj.get("code"))
                        version = obj.get("metadata", {}).get("resourceVersion", version)
                        if kind != "BOOKMARK":
                            yield kind, obj
            except KubeApiError as exc:
                raise KubeError(f"watch {path}: {exc}", exc.status or None) from exc
