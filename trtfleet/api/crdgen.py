"""Generate the CRD manifests in ``crds/`` from the pydantic models.

pydantic's JSON schema is not a structural Kubernetes schema as it stands. This
module rewrites it: ``$ref``/``$defs`` are inlined, ``anyOf [X, null]`` becomes
``X`` with ``nullable: true``, titles go, enums of a StrEnum stay enums,
``additionalProperties`` carries map value schemas, and int-or-string keeps the
Kubernetes marker. The output is deterministic so CI can diff it.
"""

from __future__ import annotations

from copy import deepcopy
from pathlib import Path
from typing import Any

import yaml

from trtfleet.api.adapter import AdapterSpec, AdapterStatus
from trtfleet.api.basemodel import BaseModelSpec, BaseModelStatus
from trtfleet.api.batch import BatchSpec, BatchStatus
from trtfleet.api.common import GROUP, VERSION, ApiModel

_DROP_KEYS = {"title", "$defs", "examples"}


def _structural(node: Any, defs: dict[str, Any]) -> Any:
    """Rewrite one pydantic schema node into its structural Kubernetes form."""
    if isinstance(node, list):
        return [_structural(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**deepcopy(target), **{k: v for k, v in node.items() if k != "$ref"}}
        return _structural(merged, defs)
    if "anyOf" in node and not node.get("x-kubernetes-int-or-string"):
        variants = [v for v in node["anyOf"] if v != {"type": "null"}]
        if len(variants) < len(node["anyOf"]) and len(variants) == 1:
            rest = {k: v for k, v in node.items() if k != "anyOf"}
            merged = {**_structural(variants[0], defs), **_structural(rest, defs)}
            merged["nullable"] = True
            merged.pop("default", None) if merged.get("default") is None else None
            return merged
    if "allOf" in node and len(node["allOf"]) == 1:
        rest = {k: v for k, v in node.items() if k != "allOf"}
        return {**_structural(node["allOf"][0], defs), **_structural(rest, defs)}
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP_KEYS:
            continue
        if key == "const":
            out["enum"] = [value]
            continue
        if key == "properties":
            out[key] = {name: _structural(sub, defs) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "anyOf", "oneOf", "allOf", "not"):
            out[key] = _structural(value, defs)
        else:
            out[key] = value
    for exclusive, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(out.get(exclusive), (int, float)) and not isinstance(out[exclusive], bool):
            # JSON Schema draft 2020 writes a number; apiextensions/v1 wants minimum/maximum + a boolean.
            out[bound] = out[exclusive]
            out[exclusive] = True
    if out.get("additionalProperties") is False:
        # Structural schemas forbid it next to properties; unknown fields are pruned
        # or, with server-side strict field validation (kubectl's default), rejected.
        del out["additionalProperties"]
    if out.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
    if "enum" in out and "type" not in out:
        out["type"] = "string" if all(isinstance(v, str) for v in out["enum"]) else "integer"
    if "default" in out and out["default"] is None:
        del out["default"]
    if "properties" in out and "type" not in out:
        out["type"] = "object"
    return out


def _inject_factory_defaults(model: type[ApiModel], schema: dict[str, Any]) -> None:
    """Give fields built by ``default_factory`` a schema default, so the API server defaults
    nested objects (``{}`` then lets the inner defaults apply) and lists."""
    properties = schema.get("properties", {})
    for name, info in model.model_fields.items():
        alias = info.alias or name
        sub = properties.get(alias)
        if sub is None:
            continue
        nested = _model_class(info.annotation)
        if info.default_factory is not None:
            value = info.default_factory()  # type: ignore[call-arg]
            # The whole default object, not {}: the API server validates a default (CEL rules
            # included) before nested defaults would fill it in.
            sub["default"] = value.to_wire() if isinstance(value, ApiModel) else [str(v) for v in value]
        if nested is not None:
            _inject_factory_defaults(nested, sub)


def _model_class(annotation: Any) -> type[ApiModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, ApiModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_class(arg)
        if found is not None:
            return found
    return None


def structural_schema(model: type[ApiModel]) -> dict[str, Any]:
    """The structural openAPIV3Schema of one pydantic model (used for spec and status)."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.get("$defs", {})
    schema: dict[str, Any] = _structural(raw, defs)
    schema.pop("description", None)
    _inject_factory_defaults(model, schema)
    return schema


def _crd(
    *,
    kind: str,
    plural: str,
    short_names: list[str],
    spec_model: type[ApiModel],
    status_model: type[ApiModel],
    columns: list[dict[str, Any]],
    description: str,
    scale: dict[str, str] | None = None,
    status_writer: str = "the trtfleet operator",
) -> dict[str, Any]:
    spec_schema = structural_schema(spec_model)
    spec_schema["description"] = f"Desired state of the {kind}."
    status_schema = structural_schema(status_model)
    status_schema["description"] = f"Observed state of the {kind}, written by {status_writer}."
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{GROUP}",
            "labels": {"app.kubernetes.io/part-of": "trtfleet"},
        },
        "spec": {
            "group": GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short_names,
                "categories": ["trtfleet"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}, **({"scale": scale} if scale else {})},
                    "additionalPrinterColumns": columns,
                    "schema": {
                        "openAPIV3Schema": {
                            "description": description,
                            "type": "object",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": status_schema,
                            },
                        }
                    },
                }
            ],
        },
    }


def build_crds() -> dict[str, dict[str, Any]]:
    """File name -> CRD manifest, for every trtfleet kind."""
    basemodels = _crd(
        kind="BaseModel",
        plural="basemodels",
        short_names=["bm"],
        spec_model=BaseModelSpec,
        status_model=BaseModelStatus,
        description="A base LLM served with multi-LoRA by a fleet of TensorRT-LLM pods (trtllm-serve or Triton).",
        scale={
            "specReplicasPath": ".spec.serving.replicas",
            "statusReplicasPath": ".status.readyReplicas",
            "labelSelectorPath": ".status.selector",
        },
        columns=[
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {"name": "Runtime", "type": "string", "jsonPath": ".spec.runtime"},
            {"name": "Engine", "type": "string", "jsonPath": ".status.engine.hash"},
            {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
            {"name": "Desired", "type": "integer", "jsonPath": ".spec.serving.replicas"},
            {"name": "ColdStart", "type": "number", "jsonPath": ".status.autoscaling.lastColdStartSeconds"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
    )
    adapters = _crd(
        kind="Adapter",
        plural="adapters",
        short_names=["lora"],
        spec_model=AdapterSpec,
        status_model=AdapterStatus,
        description="A LoRA adapter served on a BaseModel's fleet, addressed by its served name.",
        columns=[
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {"name": "Base", "type": "string", "jsonPath": ".spec.baseModel"},
            {"name": "Task", "type": "integer", "jsonPath": ".status.taskId"},
            {"name": "Rank", "type": "integer", "jsonPath": ".status.artifact.rank"},
            {"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"},
            {"name": "Variant", "type": "string", "jsonPath": ".status.baseVariant.name", "priority": 1},
            {"name": "Mode", "type": "string", "jsonPath": ".spec.mode"},
            {"name": "Serving", "type": "string", "jsonPath": ".status.merge.mode", "priority": 1},
            {"name": "Suggested", "type": "string", "jsonPath": ".status.merge.suggested"},
            {"name": "PodFraction", "type": "number", "jsonPath": ".status.merge.podFraction", "priority": 1},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
    )
    batches = _crd(
        kind="Batch",
        plural="batches",
        short_names=["bt"],
        spec_model=BatchSpec,
        status_model=BatchStatus,
        description="An offline batch of OpenAI requests run by the router in the fleet's free capacity.",
        status_writer="the trtfleet router that runs it",
        columns=[
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {"name": "Progress", "type": "integer", "jsonPath": ".status.progressPercent"},
            {"name": "Completed", "type": "integer", "jsonPath": ".status.counts.completed"},
            {"name": "Failed", "type": "integer", "jsonPath": ".status.counts.failed"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
    )
    return {
        f"{GROUP}_basemodels.yaml": basemodels,
        f"{GROUP}_adapters.yaml": adapters,
        f"{GROUP}_batches.yaml": batches,
    }


def render_crds() -> dict[str, str]:
    """File name -> YAML text, exactly as committed in ``crds/``."""
    header = "# Generated by `trtfleet crds` from trtfleet/api; do not edit by hand.\n"
    return {
        name: header + yaml.safe_dump(crd, sort_keys=True, default_flow_style=False, width=100)
        for name, crd in build_crds().items()
    }


def write_crds(out_dir: Path) -> list[Path]:
    """Write every CRD into ``out_dir`` atomically (temp file, then rename)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_crds().items():
        target = out_dir / name
        tmp = target.with_suffix(".yaml.tmp")
        tmp.write_text(text)
        tmp.replace(target)
        written.append(target)
    return written
