"""Kubernetes discovery: BaseModels, Adapters and the EndpointSlices of BaseModel Services.

Watched in one namespace (``--namespace``, default: the service account's or the kubeconfig
context's):

* ``BaseModel`` (``trtfleet.io/v1alpha1``): limits from ``spec.engine``, LoRA cache pages per pod from
  ``status.capacity.loraHostPages``/``loraDevicePages`` (else planned from ``spec``), chat template,
  dtype. Annotation ``trtfleet.io/upstream-model`` overrides the upstream model name.
* ``Adapter``: served when ``status.phase`` is Ready and ``status.taskId``/``status.artifact.uri`` are
  set; served name ``status.servedName`` (else ``spec.servedName``, else the object name); base model
  ``spec.baseModel``; weights size, rank and modules from ``status.artifact``; on a ``pytorch`` base
  model ``status.artifact.path`` (the staged PEFT directory) is sent as ``lora_request.lora_path``.
* ``EndpointSlice`` labelled ``trtfleet.io/basemodel=<label_value(name)>`` (copied from the Service; names go
  through :func:`trtfleet.api.labels.label_value` as the operator's do, so long names match):
  one pod per endpoint, address ``<ip>:<port named grpc>`` (``pytorch``: trtllm-serve's port named
  ``http``), metrics ``<ip>:<port named metrics>``,
  Triton HTTP ``<ip>:<port named http>`` (used for warm requests when present), pod
  id ``targetRef.name``, uid ``targetRef.uid`` (a new uid or IP resets that pod's shadow cache), ready
  from ``conditions.ready`` (absent = ready, as the API defines; not ready -> ready also resets the
  shadow: a container restart keeps the uid and IP but empties the LoRA cache).
* Merged Adapters (``spec.mode: merged``): the EndpointSlices of their own Service, labelled also
  ``trtfleet.io/role=merged`` and ``trtfleet.io/adapter=<label_value(adapter)>``, form a fleet of their own
  (:func:`~trtfleet_router.models_registry.merged_entry`) that takes the adapter's served name; they never
  join the base model's pool. While it has no ready pod the name is served hot-swapped on the base
  model's pool (``Target.fallback``) when an Adapter of that served name is Ready there, or when the merged
  Adapter's status still carries the ``taskId`` and ``artifact`` of its dynamic days, whatever its phase.
* QLoRA Adapters (``spec.training.baseQuantization``): served only on the base variant their
  ``status.baseVariant.name`` names, a fleet of its own (:func:`~trtfleet_router.models_registry.variant_entry`)
  made of the EndpointSlices labelled ``trtfleet.io/role=variant`` and ``trtfleet.io/variant=<that name>``;
  never on the base model's pool (other activations), not at all before the operator names the variant.

* ``InferenceObjective`` (``llm-d.ai/v1alpha2``, llm-d-router's ``apix/v1alpha2`` at ebab6879), with the routing
  file's ``tenancy.inferenceObjectives``, where its CRD is installed (asked once at start; without it, nothing is
  watched): ``metadata.name`` -> ``spec.priority`` (unset: 0), the band a gateway's objective header names.

The translation functions are pure; :class:`KubernetesDiscovery` only keeps the latest objects and
rebuilds the snapshot after every event.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from pydantic import ValidationError

from trtfleet.api.adapter import Adapter as AdapterObject
from trtfleet.api.adapter import AdapterMode, AdapterPhase, effective_mode
from trtfleet.api.basemodel import BaseModel as BaseModelObject
from trtfleet.api.basemodel import Runtime
from trtfleet.api.labels import (
    LABEL_ADAPTER,
    LABEL_BASEMODEL,
    LABEL_ROLE,
    LABEL_VARIANT,
    ROLE_MERGED,
    ROLE_VARIANT,
    label_value,
)
from trtfleet.loracache import declared_geometry, pages_for_adapter
from trtfleet_router.discovery.kubeclient import SYNC, KubeClient, KubeError
from trtfleet_router.liveview import DiscoverySnapshot, PodEndpoint
from trtfleet_router.models_registry import (
    DEFAULT_UPSTREAM_MODEL,
    AdapterEntry,
    BaseModelEntry,
    ModelRegistry,
    base_entry_from_spec,
    merged_entry,
    variant_entry,
    variant_fleet_name,
)

log = logging.getLogger(__name__)

UPSTREAM_MODEL_ANNOTATION: Final = "trtfleet.io/upstream-model"
GRPC_PORT_NAME: Final = "grpc"
METRICS_PORT_NAME: Final = "metrics"
HTTP_PORT_NAME: Final = "http"
GROUP_PATH: Final = "/apis/trtfleet.io/v1alpha1/namespaces/{ns}"
OBJECTIVES_API: Final = "llm-d.ai/v1alpha2"
"""InferenceObjective's group and version (llm-d-router ``apix/v1alpha2/doc.go``: ``+groupName=llm-d.ai``)."""


def _host_port(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def pods_from_endpointslices(
    slices: Iterable[Mapping[str, Any]], *, merged: bool = False, variant: bool = False
) -> dict[str, dict[str, PodEndpoint]]:
    """EndpointSlices -> ``{base model label value: {pod id: PodEndpoint}}`` of the base models' own pods, or
    with ``merged`` ``{adapter label value: {pod id: PodEndpoint}}`` of merged Adapters' pods, or with ``variant``
    ``{variant label value: {pod id: PodEndpoint}}`` of QLoRA base variants' pods. Keys are the labels' values:
    look a name up by ``label_value(name)`` (names over 63 characters are hashed)."""
    pods: dict[str, dict[str, PodEndpoint]] = {}
    wanted = ROLE_MERGED if merged else ROLE_VARIANT if variant else None
    key_label = LABEL_ADAPTER if merged else LABEL_VARIANT if variant else LABEL_BASEMODEL
    for slice_ in slices:
        labels = slice_.get("metadata", {}).get("labels") or {}
        role = labels.get(LABEL_ROLE)
        key = labels.get(key_label)
        if not key or (role if role in (ROLE_MERGED, ROLE_VARIANT) else None) != wanted:
            continue
        ports = {p.get("name"): p.get("port") for p in slice_.get("ports") or []}
        grpc_port, metrics_port = ports.get(GRPC_PORT_NAME), ports.get(METRICS_PORT_NAME)
        http_port = ports.get(HTTP_PORT_NAME)
        if not isinstance(grpc_port, int):
            grpc_port = http_port  # runtime pytorch: trtllm-serve's HTTP port is the only one
        if not isinstance(grpc_port, int):
            continue
        target = pods.setdefault(key, {})
        for endpoint in slice_.get("endpoints") or []:
            addresses = endpoint.get("addresses") or []
            if not addresses:
                continue
            ip = addresses[0]
            ref = endpoint.get("targetRef") or {}
            conditions = endpoint.get("conditions") or {}
            ready = conditions.get("ready") is not False and conditions.get("terminating") is not True
            pod_id = ref.get("name") or ip
            target[pod_id] = PodEndpoint(
                pod_id=pod_id,
                address=_host_port(ip, grpc_port),
                uid=f"{ref.get('uid') or pod_id}@{ip}",
                metrics_url=f"http://{_host_port(ip, metrics_port)}/metrics" if isinstance(metrics_port, int) else None,
                ready=ready,
                http_address=_host_port(ip, http_port) if isinstance(http_port, int) else None,
            )
    return pods


def base_entry_from_object(obj: Mapping[str, Any]) -> BaseModelEntry | None:
    try:
        parsed = BaseModelObject.model_validate(obj)
    except ValidationError as exc:
        log.warning(
            "BaseModel ignored",
            extra={"ctx": {"name": obj.get("metadata", {}).get("name"), "error": str(exc)[:500]}},
        )
        return None
    metadata = parsed.metadata
    upstream = (metadata.get("annotations") or {}).get(UPSTREAM_MODEL_ANNOTATION) or DEFAULT_UPSTREAM_MODEL
    return base_entry_from_spec(metadata.get("name", ""), parsed.spec, parsed.status, upstream_model=upstream)


def adapter_entry_from_object(obj: Mapping[str, Any], bases: Mapping[str, BaseModelObject]) -> AdapterEntry | None:
    """A served adapter, or None while it is not Ready (no task id or artifact yet) and once its deletion has
    started (new requests get 404 while the operator drains it and removes its artifact)."""
    if (obj.get("metadata") or {}).get("deletionTimestamp"):
        return None
    try:
        parsed = AdapterObject.model_validate(obj)
    except ValidationError as exc:
        log.warning(
            "Adapter ignored",
            extra={"ctx": {"name": obj.get("metadata", {}).get("name"), "error": str(exc)[:500]}},
        )
        return None
    status = parsed.status
    # A merged Adapter keeps the task id and artifact it had when dynamic (status carries them): served
    # hot-swapped behind its merged pods, whatever the merged phase (switching modes loses nothing).
    # (mode auto: while the operator serves it merged, status.merge.mode)
    chosen = status.merge.mode if status is not None and status.merge is not None else None
    carried = effective_mode(parsed.spec.mode, chosen) is AdapterMode.MERGED
    if status is None or (status.phase is not AdapterPhase.READY and not carried) or status.task_id is None:
        return None
    artifact = status.artifact
    if artifact is None or not artifact.uri:
        return None
    name = status.served_name or parsed.spec.served_name or parsed.metadata.get("name", "")
    base = bases.get(parsed.spec.base_model)
    geometry = declared_geometry(base.spec) if base is not None else None
    weights_bytes = artifact.bytes or 0
    fleet = parsed.spec.base_model
    if parsed.spec.base_quantization is not None:  # QLoRA: its base variant's pods only
        variant = status.base_variant.name if status.base_variant is not None else None
        if not variant:
            return None
        fleet = variant_fleet_name(variant)
    return AdapterEntry(
        served_name=name,
        base_model=fleet,
        task_id=status.task_id,
        artifact_uri=artifact.uri,
        sha256=artifact.sha256,
        weights_bytes=weights_bytes,
        pages=pages_for_adapter(geometry, artifact.rank, artifact.modules, weights_bytes),
        min_pods=parsed.spec.warm.min_pods,
        lora_path=(artifact.path or "") if base is not None and base.spec.runtime is Runtime.PYTORCH else "",
    )


def build_snapshot(
    basemodels: Iterable[Mapping[str, Any]],
    adapters: Iterable[Mapping[str, Any]],
    slices: Iterable[Mapping[str, Any]],
) -> DiscoverySnapshot:
    """The router's view from the three object lists (pure)."""
    parsed_bases: dict[str, BaseModelObject] = {}
    entries = []
    for obj in basemodels:
        entry = base_entry_from_object(obj)
        if entry is not None:
            entries.append(entry)
            parsed_bases[entry.name] = BaseModelObject.model_validate(obj)
    adapters = list(adapters)
    adapter_entries = [a for a in (adapter_entry_from_object(o, parsed_bases) for o in adapters) if a is not None]
    slices = list(slices)
    pods = pods_from_endpointslices(slices)
    fleet_pods = {name: pods.get(label_value(name), {}) for name in parsed_bases}
    merged_pods = pods_from_endpointslices(slices, merged=True)
    by_name = {entry.name: entry for entry in entries}
    variant_pods = pods_from_endpointslices(slices, variant=True)
    for variant, base_name in sorted(_variants(adapters).items()):
        if base_name in by_name:
            entries.append(variant_entry(by_name[base_name], variant))
            fleet_pods[entries[-1].name] = variant_pods.get(label_value(variant), {})
    for obj in adapters:
        own_pods = merged_pods.get(label_value(str(obj.get("metadata", {}).get("name", ""))), {})
        merged = merged_fleet_from_object(obj, by_name, has_pods=bool(own_pods))
        if merged is not None:
            entries.append(merged)
            fleet_pods[merged.name] = own_pods
    return DiscoverySnapshot(ModelRegistry(entries, adapter_entries), fleet_pods)


def objective_priorities(objectives: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """InferenceObjective name -> ``spec.priority`` (unset or not an integer: 0, as llm-d's picker reads it)."""
    found = {}
    for obj in objectives:
        name = str(obj.get("metadata", {}).get("name", ""))
        priority = (obj.get("spec") or {}).get("priority")
        if name:
            found[name] = priority if isinstance(priority, int) and not isinstance(priority, bool) else 0
    return found


def _variants(adapters: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Base variant name -> its BaseModel, for every QLoRA Adapter whose status names a variant."""
    variants: dict[str, str] = {}
    for obj in adapters:
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        variant = (status.get("baseVariant") or {}).get("name")
        if ((spec.get("training") or {}).get("baseQuantization") and variant and spec.get("baseModel")
                and not (obj.get("metadata") or {}).get("deletionTimestamp")):
            variants[str(variant)] = str(spec["baseModel"])
    return variants


def merged_fleet_from_object(
    obj: Mapping[str, Any], bases: Mapping[str, BaseModelEntry], *, has_pods: bool = False
) -> BaseModelEntry | None:
    """The merged fleet of an Adapter served merged (``spec.mode: merged``, or ``auto`` with
    ``status.merge.mode: merged``) on a known base model, or of one switched
    back to dynamic whose merged pods still run (``has_pods``: they serve until the operator removes them,
    once it is Ready hot-swapped); else None."""
    try:
        parsed = AdapterObject.model_validate(obj)
    except ValidationError:
        return None  # logged by adapter_entry_from_object
    base = bases.get(parsed.spec.base_model)
    status = parsed.status
    chosen = status.merge.mode if status is not None and status.merge is not None else None
    wanted = effective_mode(parsed.spec.mode, chosen) is AdapterMode.MERGED or has_pods
    if not wanted or base is None or parsed.metadata.get("deletionTimestamp"):
        return None
    name = (status.served_name if status else None) or parsed.spec.served_name or parsed.metadata.get("name", "")
    return merged_entry(base, name)


class KubernetesDiscovery:
    """Watches the three kinds (and InferenceObjectives when asked and installed) and applies a fresh snapshot after
    every change."""

    def __init__(
        self,
        client: KubeClient,
        namespace: str | None = None,
        *,
        inference_objectives: bool = False,
        objectives_api: str = OBJECTIVES_API,
    ) -> None:
        self.client = client
        self.namespace = namespace or client.namespace
        self.inference_objectives = inference_objectives
        self.objectives_api = objectives_api
        self._objects: dict[str, dict[str, Mapping[str, Any]]] = {"bm": {}, "ad": {}, "es": {}}
        self._synced: set[str] = set()

    def _paths(self) -> dict[str, tuple[str, str | None]]:
        group = GROUP_PATH.format(ns=self.namespace)
        paths: dict[str, tuple[str, str | None]] = {
            "bm": (f"{group}/basemodels", None),
            "ad": (f"{group}/adapters", None),
            "es": (f"/apis/discovery.k8s.io/v1/namespaces/{self.namespace}/endpointslices", LABEL_BASEMODEL),
        }
        if "io" in self._objects:
            paths["io"] = (f"/apis/{self.objectives_api}/namespaces/{self.namespace}/inferenceobjectives", None)
        return paths

    async def _objectives_installed(self) -> bool:
        """Whether the API server serves InferenceObjectives (their CRD is installed)."""
        try:
            resources = await self.client.list(f"/apis/{self.objectives_api}")
        except KubeError as exc:
            log.info(
                "InferenceObjectives not read: their API is not served here",
                extra={"ctx": {"group_version": self.objectives_api, "error": str(exc)}},
            )
            return False
        return any(r.get("name") == "inferenceobjectives" for r in resources.get("resources") or [])

    def initial(self) -> DiscoverySnapshot:
        """Empty: the router serves nothing until every watch has listed once."""
        return DiscoverySnapshot(ModelRegistry())

    def snapshot(self) -> DiscoverySnapshot:
        o = self._objects
        snapshot = build_snapshot(o["bm"].values(), o["ad"].values(), o["es"].values())
        if "io" in o:
            snapshot = dataclasses.replace(snapshot, objective_priorities=objective_priorities(o["io"].values()))
        return snapshot

    async def run(self, apply: Callable[[DiscoverySnapshot], None]) -> None:
        if self.inference_objectives and await self._objectives_installed():
            self._objects["io"] = {}
        await asyncio.gather(
            *(self._follow(kind, path, selector, apply) for kind, (path, selector) in self._paths().items())
        )

    async def _follow(
        self, kind: str, path: str, selector: str | None, apply: Callable[[DiscoverySnapshot], None]
    ) -> None:
        objects = self._objects[kind]
        async for event, payload in self.client.watch(path, selector):
            if event == SYNC:
                objects.clear()
                for item in payload:
                    objects[_key(item)] = item
                self._synced.add(kind)
            elif event == "DELETED":
                objects.pop(_key(payload), None)
            else:
                objects[_key(payload)] = payload
            if len(self._synced) == len(self._objects):
                apply(self.snapshot())


def _key(obj: Mapping[str, Any]) -> str:
    return str(obj.get("metadata", {}).get("name", ""))
