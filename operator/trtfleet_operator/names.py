"""Names, labels and annotations of everything the operator creates, derived from its inputs only.

Conventions other components rely on (the router watches them):

* Serving pods carry ``trtfleet.io/basemodel=<BaseModel>`` (every object name in a label value passes
  through ``label_value`` of :mod:`trtfleet.api.labels`, which the router uses too),
  ``trtfleet.io/engine-hash=<first 16 hex digits of the engine hash>`` and ``trtfleet.io/role`` = ``base``
  or ``merged``; merged pods add ``trtfleet.io/adapter=<Adapter>``. The full engine hash is in the
  ``trtfleet.io/engine-hash`` annotation.
* The headless Service of a BaseModel is named like the BaseModel and labelled
  ``trtfleet.io/basemodel=<name>, trtfleet.io/role=base``; a merged adapter's Service adds
  ``trtfleet.io/adapter=<name>`` and ``trtfleet.io/role=merged``.
* A QLoRA base variant (the BaseModel dequantized as an Adapter's ``training.baseQuantization`` says) has a
  Deployment, Service and PDB named :func:`variant_serving_name` (``<base>-q-<10 hex digits of its hash>``),
  labelled ``trtfleet.io/basemodel=<base>, trtfleet.io/role=variant, trtfleet.io/variant=<that name>`` and
  owned by every Adapter it serves (so the last one's deletion removes it).
* Build Jobs are named ``trtfleet-build-<hash16>`` (``-<attempt>`` from the second attempt on), one per
  engine hash and namespace, whoever asks for it. ``runtime: pytorch`` has prepare Jobs instead,
  ``trtfleet-prepare-<hash16>`` per prepare hash, run by the same machinery (and listed with the same
  ``app.kubernetes.io/component=engine-build`` label; ``trtfleet.io/runtime`` tells them apart).
* With the chart's ``gateway.inferencePool`` on, a BaseModel's InferencePool is named like its Service, labelled
  ``trtfleet.io/basemodel=<name>, app.kubernetes.io/component=inference-pool``, and selects the pods labelled
  ``trtfleet.io/basemodel=<name>, app.kubernetes.io/component=serving`` (base, merged and variant pods).
* A ``pytorch`` BaseModel's LLM-API options are in the ConfigMap ``<serving name>-llm-api-options``,
  labelled ``trtfleet.io/options-hash=<digest of the file>``.
"""

from __future__ import annotations

import re
from typing import Any

from trtfleet.api.labels import LABEL_ADAPTER as LABEL_ADAPTER
from trtfleet.api.labels import LABEL_BASEMODEL as LABEL_BASEMODEL
from trtfleet.api.labels import LABEL_ROLE as LABEL_ROLE
from trtfleet.api.labels import LABEL_VARIANT as LABEL_VARIANT
from trtfleet.api.labels import ROLE_BASE as ROLE_BASE
from trtfleet.api.labels import ROLE_MERGED as ROLE_MERGED
from trtfleet.api.labels import ROLE_VARIANT as ROLE_VARIANT
from trtfleet.api.labels import digest as digest
from trtfleet.api.labels import label_value as label_value

FIELD_MANAGER = "trtfleet-operator"
MANAGED_BY = "trtfleet-operator"
PART_OF = "trtfleet"

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_PART_OF = "app.kubernetes.io/part-of"
LABEL_ENGINE_HASH = "trtfleet.io/engine-hash"
LABEL_RUNTIME = "trtfleet.io/runtime"
LABEL_SOURCE_KEY = "trtfleet.io/source-key"
LABEL_BUILD_ATTEMPT = "trtfleet.io/build-attempt"
LABEL_JOB_NAME = "batch.kubernetes.io/job-name"
LABEL_OPTIONS_HASH = "trtfleet.io/options-hash"

ANNOTATION_ENGINE_HASH = "trtfleet.io/engine-hash"
ANNOTATION_SPEC_HASH = "trtfleet.io/spec-hash"
ANNOTATION_SOURCE_URI = "trtfleet.io/source-uri"

COMPONENT_SERVING = "serving"
COMPONENT_ENGINE_BUILD = "engine-build"
COMPONENT_BUILD_PLAN = "build-plan"
COMPONENT_ENGINE_RECORD = "engine-record"
COMPONENT_MODEL_REPO = "model-repository"
COMPONENT_ADAPTER_CONVERT = "adapter-convert"
COMPONENT_LLM_API_OPTIONS = "llm-api-options"
COMPONENT_COLLECT = "collect"
COMPONENT_INFERENCE_POOL = "inference-pool"
ANNOTATION_UNUSED_SINCE = "trtfleet.io/unused-since"
"""On an engine record: when the operator first saw no BaseModel, Adapter, Deployment or Job use its hash."""

VARIANT_HASH_CHARS = 10

DNS_LABEL_MAX = 63
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def hash16(engine_hash: str) -> str:
    """The first 16 lowercase hex/alphanumeric characters of a hash, without a ``sha256:`` style prefix."""
    tail = engine_hash.rsplit(":", 1)[-1]
    if tail.startswith("sha256-"):
        tail = tail[len("sha256-") :]
    cleaned = re.sub(r"[^a-z0-9]", "", tail.lower())
    return (cleaned or digest(engine_hash))[:16]


def engine_hash_label(engine_hash: str) -> str:
    """The label form of an engine hash: its 16-character short form (``engine_hash_short`` of the engine
    tooling); label values hold at most 63 characters and a sha256 has 64. The full hash is in the
    ``trtfleet.io/engine-hash`` annotation."""
    return hash16(engine_hash)


def dns_label(name: str) -> str:
    """``name`` if it is a DNS-1035 label (Service names), else a stable shortened or prefixed form."""
    if len(name) <= DNS_LABEL_MAX and _DNS_LABEL.match(name):
        return name
    cleaned = re.sub(r"[^a-z0-9-]", "-", name.lower())
    if not cleaned[:1].isalpha():
        cleaned = f"m-{cleaned}"
    cleaned = cleaned[: DNS_LABEL_MAX - 9].strip("-")
    return f"{cleaned}-{digest(name, 8)}"


def build_job_name(engine_hash: str, attempt: int = 1) -> str:
    base = f"trtfleet-build-{hash16(engine_hash)}"
    return base if attempt <= 1 else f"{base}-{attempt}"


def prepare_job_name(prepare_hash: str, attempt: int = 1) -> str:
    base = f"trtfleet-prepare-{hash16(prepare_hash)}"
    return base if attempt <= 1 else f"{base}-{attempt}"


def plan_configmap_name(engine_hash: str) -> str:
    return f"trtfleet-plan-{hash16(engine_hash)}"


def engine_record_name(engine_hash: str) -> str:
    return f"trtfleet-engine-{hash16(engine_hash)}"


def serving_name(basemodel: str) -> str:
    """Deployment, Service and PodDisruptionBudget of a BaseModel."""
    return dns_label(basemodel)


def merged_serving_name(adapter: str) -> str:
    """Deployment, Service and PodDisruptionBudget of a merged Adapter."""
    return dns_label(f"{adapter}-merged")


def variant_serving_name(basemodel: str, variant_hash: str) -> str:
    """Deployment, Service and PodDisruptionBudget of a QLoRA base variant of ``basemodel`` (at most 63
    characters: a long BaseModel name is shortened with a digest, the hash part always stays)."""
    suffix = f"-q-{hash16(variant_hash)[:VARIANT_HASH_CHARS]}"
    return f"{dns_label(basemodel)[: DNS_LABEL_MAX - len(suffix)].rstrip('-')}{suffix}"


def model_repo_configmap_name(serving: str) -> str:
    return f"{serving}-model-repo"


def options_configmap_name(serving: str) -> str:
    return f"{serving}-llm-api-options"


def collect_job_name(what: str) -> str:
    """The collect Job of one directory of a volume (``what``: its volume and path)."""
    return f"trtfleet-collect-{digest(what, 16)}"


def convert_job_name(adapter: str, source_key: str) -> str:
    return dns_label(f"trtfleet-convert-{adapter}-{source_key[:8]}")


def common_labels(component: str) -> dict[str, str]:
    return {
        LABEL_COMPONENT: component,
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_PART_OF: PART_OF,
    }


def owner_reference(kind: str, api_version: str, name: str, uid: str, *, controller: bool) -> dict[str, Any]:
    """An ownerReference; a controller owner also blocks the owner's foreground deletion."""
    ref: dict[str, Any] = {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid}
    if controller:
        ref["controller"] = True
        ref["blockOwnerDeletion"] = True
    return ref
