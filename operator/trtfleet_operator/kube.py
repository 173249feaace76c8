"""The operator's calls to the Kubernetes API, over the shared client :class:`trtfleet.kube.KubeApi`.

* server-side apply: ``PATCH <object>?fieldManager=trtfleet-operator&force=true`` with
  ``application/apply-patch+yaml`` (JSON is YAML);
* get / list (label selectors) / delete (with a uid precondition) / JSON merge patch, on the main resource
  or the ``status`` subresource; a merge patch that carries ``metadata.resourceVersion`` is a
  compare-and-swap (409 Conflict when the object changed);
* core/v1 Events.

Credentials and TLS are wholly the shared layer's (:mod:`trtfleet.kube.config`). Its errors become
:mod:`trtfleet_operator.errors` classes here, in :meth:`KubeClient.request`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from trtfleet.api import API_VERSION
from trtfleet.kube import KubeApi, KubeApiError
from trtfleet_operator.errors import KubeError, KubeUnavailableError, kube_error
from trtfleet_operator.names import FIELD_MANAGER

Obj = dict[str, Any]

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
    ("inference.networking.k8s.io/v1", "InferencePool"): "inferencepools",
}


def collection_path(api_version: str, kind: str, namespace: str) -> str:
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{prefix}/namespaces/{quote(namespace)}/{PLURALS[(api_version, kind)]}"


def object_path(api_version: str, kind: str, namespace: str, name: str) -> str:
    return f"{collection_path(api_version, kind, namespace)}/{quote(name)}"


def path_of(obj: Mapping[str, Any]) -> str:
    meta = obj["metadata"]
    return object_path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])


class KubeClient:
    """The operator's verbs over one :class:`KubeApi` (which this client closes)."""

    def __init__(self, api: KubeApi, *, field_manager: str = FIELD_MANAGER) -> None:
        self.api = api
        self.field_manager = field_manager

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.api.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Obj:
        try:
            return await self.api.request(method, path, params=params, body=body, content_type=content_type)
        except KubeApiError as exc:
            if exc.status == 0:
                raise KubeUnavailableError(0, exc.reason, exc.message) from exc
            raise kube_error(exc.status, exc.reason, exc.message) from exc

    async def get(self, path: str) -> Obj | None:
        try:
            return await self.request("GET", path)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    async def serves(self, api_version: str, plural: str) -> bool:
        """Whether the API server's discovery lists ``plural`` under ``api_version`` (a CRD may be missing)."""
        resources = await self.get(f"/apis/{api_version}")
        return any(r.get("name") == plural for r in (resources or {}).get("resources") or ())

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
