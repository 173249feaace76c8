"""A small asyncio Kubernetes client on aiohttp: exactly the calls the operator makes.

* server-side apply: ``PATCH <object>?fieldManager=trtfleet-operator&force=true`` with
  ``application/apply-patch+yaml`` (JSON is YAML);
* get / list (label selectors) / delete (with a uid precondition) / JSON merge patch, on the main resource
  or the ``status`` subresource; a merge patch that carries ``metadata.resourceVersion`` is a
  compare-and-swap (409 Conflict when the object changed);
* core/v1 Events.

Credentials come from a kubeconfig (client certificates, bearer tokens, CA files or inline data) or from
the in-cluster service account (token re-read every minute, since bound tokens rotate). Exec and
auth-provider plugins are not supported. HTTP errors become :mod:`trtfleet_operator.errors` classes.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import yaml

from trtfleet.api import API_VERSION
from trtfleet_operator.errors import ConfigError, KubeError, KubeUnavailableError, kube_error
from trtfleet_operator.names import FIELD_MANAGER

Obj = dict[str, Any]

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REFRESH_S = 60.0
REQUEST_TIMEOUT_S = 30.0

PLURALS: dict[tuple[str, str], str] = {
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "Service"): "services",
    ("v1", "Pod"): "pods",
    ("v1", "Event"): "events",
    ("apps/v1", "Deployment"): "deployments",
    ("batch/v1", "Job"): "jobs",
    ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudgets",
    (API_VERSION, "BaseModel"): "basemodels",
    (API_VERSION, "Adapter"): "adapters",
}


def collection_path(api_version: str, kind: str, namespace: str) -> str:
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{prefix}/namespaces/{quote(namespace)}/{PLURALS[(api_version, kind)]}"


def object_path(api_version: str, kind: str, namespace: str, name: str) -> str:
    return f"{collection_path(api_version, kind, namespace)}/{quote(name)}"


def path_of(obj: Mapping[str, Any]) -> str:
    meta = obj["metadata"]
    return object_path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])


@dataclass(frozen=True)
class Credentials:
    server: str
    ssl_context: ssl.SSLContext | bool
    token: str | None = None
    token_file: str | None = None
    namespace: str = "default"


def _data_or_file(entry: Mapping[str, Any], key: str, base: Path) -> tuple[bytes | None, str | None]:
    if entry.get(f"{key}-data"):
        return base64.b64decode(entry[f"{key}-data"]), None
    if entry.get(key):
        path = Path(entry[key])
        return None, str(path if path.is_absolute() else base / path)
    return None, None


def _load_client_cert(context: ssl.SSLContext, user: Mapping[str, Any], base: Path) -> None:
    cert_data, cert_file = _data_or_file(user, "client-certificate", base)
    key_data, key_file = _data_or_file(user, "client-key", base)
    if cert_data is None and cert_file is None:
        return
    with tempfile.TemporaryDirectory(prefix="trtfleet-kube-") as tmp:
        if cert_data is not None:
            cert_file = os.path.join(tmp, "client.crt")
            Path(cert_file).write_bytes(cert_data)
        if key_data is not None:
            key_file = os.path.join(tmp, "client.key")
            Path(key_file).write_bytes(key_data)
            os.chmod(key_file, 0o600)
        assert cert_file is not None
        context.load_cert_chain(cert_file, key_file)


def credentials_from_kubeconfig(path: Path, context_name: str | None = None) -> Credentials:
    try:
        config = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read kubeconfig {path}: {exc}") from exc
    name = context_name or config.get("current-context")
    contexts = {c["name"]: c.get("context", {}) for c in config.get("contexts") or []}
    if name not in contexts:
        raise ConfigError(f"kubeconfig {path} has no context {name!r}")
    context = contexts[name]
    clusters = {c["name"]: c.get("cluster", {}) for c in config.get("clusters") or []}
    users = {u["name"]: u.get("user", {}) for u in config.get("users") or []}
    cluster = clusters.get(context.get("cluster"), {})
    user = users.get(context.get("user"), {})
    if user.get("exec") or user.get("auth-provider"):
        raise ConfigError(f"kubeconfig {path}: exec and auth-provider credentials are not supported")
    base = path.parent
    ssl_context: ssl.SSLContext | bool
    if cluster.get("insecure-skip-tls-verify"):
        ssl_context = ssl.create_default_context()
        ssl_context.check_hostname = False
        ssl_context.verify_mode = ssl.CERT_NONE
    else:
        ca_data, ca_file = _data_or_file(cluster, "certificate-authority", base)
        ssl_context = ssl.create_default_context(cafile=ca_file, cadata=ca_data.decode() if ca_data else None)
    _load_client_cert(ssl_context, user, base)
    return Credentials(
        server=str(cluster.get("server", "")).rstrip("/"),
        ssl_context=ssl_context,
        token=user.get("token"),
        token_file=user.get("tokenFile"),
        namespace=context.get("namespace", "default"),
    )


def credentials_in_cluster() -> Credentials:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise ConfigError("not in a cluster (KUBERNETES_SERVICE_HOST unset) and no kubeconfig found")
    host = f"[{host}]" if ":" in host else host
    namespace = (SA_DIR / "namespace").read_text().strip() if (SA_DIR / "namespace").exists() else "default"
    return Credentials(
        server=f"https://{host}:{port}",
        ssl_context=ssl.create_default_context(cafile=str(SA_DIR / "ca.crt")),
        token_file=str(SA_DIR / "token"),
        namespace=namespace,
    )


def default_credentials() -> Credentials:
    """$KUBECONFIG (first file), else ~/.kube/config, else the in-cluster service account."""
    env = os.environ.get("KUBECONFIG")
    if env:
        return credentials_from_kubeconfig(Path(env.split(os.pathsep)[0]).expanduser())
    home = Path("~/.kube/config").expanduser()
    if home.is_file() and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        return credentials_from_kubeconfig(home)
    return credentials_in_cluster()


class KubeClient:
    """One aiohttp session to one API server."""

    def __init__(self, credentials: Credentials, *, field_manager: str = FIELD_MANAGER) -> None:
        self.credentials = credentials
        self.field_manager = field_manager
        self._session: aiohttp.ClientSession | None = None
        self._token: str | None = credentials.token
        self._token_read_at = 0.0

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _session_for_request(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self.credentials.ssl_context, limit=32)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
            )
        return self._session

    def _bearer(self) -> str | None:
        token_file = self.credentials.token_file
        if token_file and time.monotonic() - self._token_read_at > TOKEN_REFRESH_S:
            self._token = Path(token_file).read_text().strip()
            self._token_read_at = time.monotonic()
        return self._token

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Obj:
        headers = {"Accept": "application/json"}
        token = self._bearer()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body)
        url = f"{self.credentials.server}{path}"
        try:
            async with self._session_for_request().request(
                method, url, params=params, data=data, headers=headers
            ) as response:
                text = await response.text()
                if response.status >= 400:
                    try:
                        status = json.loads(text)
                    except ValueError:
                        status = {"reason": response.reason or "", "message": text[:500]}
                    raise kube_error(response.status, str(status.get("reason", "")), str(status.get("message", "")))
                return json.loads(text) if text else {}
        except (aiohttp.ClientConnectionError, TimeoutError) as exc:
            raise KubeUnavailableError(0, "Unavailable", f"{method} {path}: {exc!r}") from exc

    async def get(self, path: str) -> Obj | None:
        try:
            return await self.request("GET", path)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    async def list(self, path: str, *, label_selector: str | None = None) -> list[Obj]:
        """Items of a collection, each with ``apiVersion`` and ``kind`` filled in."""
        params = {"labelSelector": label_selector} if label_selector else None
        listing = await self.request("GET", path, params=params)
        api_version = listing.get("apiVersion", "v1")
        kind = str(listing.get("kind", "")).removesuffix("List")
        return [{"apiVersion": api_version, "kind": kind, **item} for item in listing.get("items") or []]

    async def apply(self, obj: Mapping[str, Any]) -> Obj:
        """Server-side apply under this client's field manager, taking over conflicting fields."""
        params = {"fieldManager": self.field_manager, "force": "true"}
        return await self.request(
            "PATCH", path_of(obj), params=params, body=obj, content_type="application/apply-patch+yaml"
        )

    async def patch_merge(self, path: str, patch: Mapping[str, Any], *, status: bool = False) -> Obj:
        params = {"fieldManager": self.field_manager}
        return await self.request(
            "PATCH",
            f"{path}/status" if status else path,
            params=params,
            body=patch,
            content_type="application/merge-patch+json",
        )

    async def patch_json(self, path: str, operations: Sequence[Mapping[str, Any]]) -> Obj:
        return await self.request(
            "PATCH",
            path,
            params={"fieldManager": self.field_manager},
            body=list(operations),
            content_type="application/json-patch+json",
        )

    async def delete(self, path: str, *, uid: str | None = None, propagation: str = "Background") -> bool:
        """Delete; False when it was already gone (or replaced by another object of the same name)."""
        body: Obj = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            await self.request("DELETE", path, body=body)
        except KubeError as exc:
            if exc.status == 404 or (exc.status == 409 and uid):
                return False
            raise
        return True

    async def event(self, involved: Mapping[str, Any], *, type_: str, reason: str, message: str, now: str) -> None:
        meta = involved["metadata"]
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": involved.get("apiVersion"),
                "kind": involved.get("kind"),
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": self.field_manager},
            "reportingComponent": self.field_manager,
            "reportingInstance": os.environ.get("HOSTNAME", self.field_manager),
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        await self.request("POST", collection_path("v1", "Event", meta["namespace"]), body=event)


class KubeTaskIdStore:
    """:class:`trtfleet_operator.taskids.TaskIdStore` over BaseModel status and resourceVersion."""

    def __init__(self, client: KubeClient) -> None:
        self._client = client

    async def read_next_task_id(self, namespace: str, basemodel: str) -> tuple[int | None, str]:
        obj = await self._client.request("GET", object_path(API_VERSION, "BaseModel", namespace, basemodel))
        value = (obj.get("status") or {}).get("nextTaskId")
        return (int(value) if value is not None else None), str(obj["metadata"]["resourceVersion"])

    async def write_next_task_id(self, namespace: str, basemodel: str, resource_version: str, value: int) -> None:
        patch = {"metadata": {"resourceVersion": resource_version}, "status": {"nextTaskId": value}}
        await self._client.patch_merge(object_path(API_VERSION, "BaseModel", namespace, basemodel), patch, status=True)
