"""One asyncio Kubernetes API client for the operator and the router, on ``kubernetes_asyncio``.

The library owns credentials and TLS (:mod:`trtfleet.kube.config`) and its aiohttp session carries every
request; this module only sends JSON to a path and reads JSON back, because both components work on
plain dicts (the generated models would cost a parse per object and buy nothing here; see the
"Kubernetes client" section of docs/benchmarks/overhead.md for the figures).

* :meth:`KubeApi.request` - one call; the body is sent as JSON under the given content type
  (``application/apply-patch+yaml`` for server-side apply, ``application/merge-patch+json``, ...); an
  error status becomes :class:`trtfleet.kube.errors.KubeApiError` with the Status object's reason and
  message, an unreachable server ``KubeApiError(0, "Unavailable", ...)``.
* :meth:`KubeApi.stream` - the newline-delimited JSON objects of a watch.
* A 401 reloads the credentials through the library once and retries (a rotated service-account token
  or an expired exec-plugin token); concurrent 401s share one reload.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Mapping
from typing import Any, Final

import aiohttp
import orjson
from kubernetes_asyncio.client import ApiClient, Configuration

from trtfleet.kube.config import KubeConnection, KubeSource, load_connection
from trtfleet.kube.errors import KubeApiError, KubeConfigError
from trtfleet.version import __version__

Obj = dict[str, Any]

REQUEST_TIMEOUT_S: Final = 30.0
WATCH_LINE_MAX_BYTES: Final = 2**21
"""One watch event may carry an object up to etcd's 1.5 MiB request limit (the library's figure)."""
UNAUTHORIZED: Final = 401
USER_AGENT: Final = f"trtfleet/{__version__}"


def _tls_identity(configuration: Configuration) -> tuple[object, ...]:
    """What the library's aiohttp session was built with; a change needs a new session."""
    c = configuration
    return (c.host, c.ssl_ca_cert, c.cert_file, c.key_file, c.verify_ssl, c.tls_server_name, c.proxy)


def _api_client(configuration: Configuration) -> ApiClient:
    """The library's client with one change, its session's ``trust_env``: with it aiohttp looks up the
    proxy and ``.netrc`` in a thread for every request, which took 1.7 to 2.5 times the client CPU per call (see
    docs/benchmarks/overhead.md, "Kubernetes client"). The proxy is resolved once instead, when the credentials
    are loaded (:func:`trtfleet.kube.config.environment_proxy`). The library's TLS connector is kept."""
    client = ApiClient(configuration)
    client.user_agent = USER_AGENT
    library_session = client.rest_client.pool_manager
    client.rest_client.pool_manager = aiohttp.ClientSession(
        connector=library_session.connector, trust_env=False, read_bufsize=WATCH_LINE_MAX_BYTES
    )
    library_session.detach()
    return client


def api_error(status: int, body: bytes, fallback_reason: str) -> KubeApiError:
    """A :class:`KubeApiError` from an error answer (a Status object, else the first 500 bytes)."""
    try:
        parsed = orjson.loads(body) if body else {}
    except orjson.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        return KubeApiError(status, fallback_reason, body[:500].decode(errors="replace"))
    return KubeApiError(status, str(parsed.get("reason") or fallback_reason), str(parsed.get("message") or ""))


class KubeApi:
    """The API server of one :class:`KubeSource`; create with :meth:`connect`, end with :meth:`close`."""

    def __init__(self, source: KubeSource, connection: KubeConnection) -> None:
        self.source = source
        self.namespace = connection.namespace
        self.in_cluster = connection.in_cluster
        self._api = _api_client(connection.configuration)
        self._retired: list[ApiClient] = []
        self._generation = 0
        self.reloads = 0
        """How many times the credentials were loaded again after a 401."""
        self._reload_lock = asyncio.Lock()

    @classmethod
    async def connect(cls, source: KubeSource | None = None) -> KubeApi:
        source = source or KubeSource()
        return cls(source, await load_connection(source))

    @property
    def configuration(self) -> Configuration:
        return self._api.configuration

    async def close(self) -> None:
        for client in (self._api, *self._retired):
            await client.close()
        self._retired.clear()

    async def __aenter__(self) -> KubeApi:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def reload(self, seen_generation: int | None = None) -> None:
        """Load the credentials again (unless another caller did since ``seen_generation``)."""
        async with self._reload_lock:
            if seen_generation is not None and seen_generation != self._generation:
                return
            configuration = (await load_connection(self.source)).configuration
            if _tls_identity(configuration) == _tls_identity(self._api.configuration):
                self._api.configuration = configuration  # a new token on the same session
            else:  # a new client certificate or server: a new session; in-flight calls finish on the old one
                self._retired.append(self._api)
                self._api = _api_client(configuration)
            self._generation += 1
            self.reloads += 1

    async def _send(
        self,
        method: str,
        path: str,
        params: Mapping[str, str] | None,
        body: Any,
        content_type: str,
        timeout: aiohttp.ClientTimeout,
    ) -> aiohttp.ClientResponse:
        for attempt in range(2):
            api, generation = self._api, self._generation
            headers = {"Accept": "application/json", "Content-Type": content_type, **api.default_headers}
            await api.update_params_for_auth(headers, [], ["BearerToken"])
            try:
                response: aiohttp.ClientResponse = await api.rest_client.request(
                    method,
                    f"{api.configuration.host}{path}",
                    query_params=dict(params) if params else None,
                    headers=headers,
                    body=body,
                    _preload_content=False,
                    _request_timeout=timeout,
                )
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                raise KubeApiError(0, "Unavailable", f"{method} {path}: {exc!r}") from exc
            if response.status != UNAUTHORIZED or attempt:
                return response
            response.release()
            try:
                await self.reload(generation)
            except KubeConfigError as exc:  # a 401 still: the caller's retry rules apply
                raise KubeApiError(
                    UNAUTHORIZED, "Unauthorized", f"{method} {path}: reloading credentials: {exc}"
                ) from exc
        raise AssertionError("unreachable")

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> Obj:
        """One call; the decoded JSON answer (``{}`` when empty)."""
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        response = await self._send(method, path, params, body, content_type, timeout)
        try:
            data = await response.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise KubeApiError(0, "Unavailable", f"{method} {path}: {exc!r}") from exc
        finally:
            response.release()
        if response.status >= 400:
            raise api_error(response.status, data, response.reason or "")
        result = orjson.loads(data) if data else {}
        return result if isinstance(result, dict) else {"items": result}

    async def stream(self, path: str, params: Mapping[str, str], *, read_timeout_s: float) -> AsyncGenerator[Obj, None]:
        """The JSON objects of a streaming GET (a watch), one per line, until the server ends it."""
        timeout = aiohttp.ClientTimeout(total=None, sock_read=read_timeout_s)
        response = await self._send("GET", path, params, None, "application/json", timeout)
        try:
            if response.status >= 400:
                raise api_error(response.status, await response.read(), response.reason or "")
            async for line in response.content:
                if line.strip():
                    yield orjson.loads(line)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise KubeApiError(0, "Unavailable", f"watch {path}: {exc!r}") from exc
        except orjson.JSONDecodeError as exc:
            raise KubeApiError(0, "BadWatchLine", f"watch {path}: {exc}") from exc
        finally:
            response.close()
