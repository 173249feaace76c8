"""Golden files of the operator's builders: every Kubernetes object it creates, per case.

Each ``<case>/input.yaml`` holds a BaseModel, optionally followed by an Adapter of it; ``<case>/expected/``
holds the objects the operator builds for them, as YAML with sorted keys (a BaseModel's InferencePool too, as
the operator renders it with ``--inference-pool-picker trtfleet-epp:9002``). Every object is also checked
against the Kubernetes OpenAPI schema, the InferencePool against GIE's CRD (strict: unknown fields fail). Regenerate on purpose with
``pytest tests/golden/operator --update-golden`` and review the diff like code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from trtfleet_operator.builders.convert import build_convert_job
from trtfleet_operator.builders.enginebuild import build_engine_job, build_engine_record, build_plan_configmap
from trtfleet_operator.builders.inferencepool import build_inference_pool, http_port, pool_selector
from trtfleet_operator.builders.pytorch import build_options_configmap, build_prepare_job, build_pytorch_deployment
from trtfleet_operator.builders.service import build_pdb, build_service
from trtfleet_operator.builders.serving import (
    build_deployment,
    build_model_repo_configmap,
    reference_merged_args,
)
from trtfleet_operator.config import Images, InferencePoolConfig, OperatorConfig
from trtfleet_operator.names import (
    LABEL_ADAPTER,
    LABEL_BASEMODEL,
    LABEL_VARIANT,
    merged_serving_name,
    owner_reference,
    prepare_job_name,
    serving_name,
    variant_serving_name,
)
from trtfleet_operator.planning import MODEL_CACHE_MOUNT, EnginePlan, plan_engine, plan_merged, plan_variant
from trtfleet_operator.reconcile.variant import VariantWant, variant_deployment, variant_service_and_pdb
from trtfleet_operator.taskids import source_key

from tests.support import inferencepool
from tests.support.golden import check_golden_dir
from trtfleet.api import API_VERSION, Adapter, AdapterMode, BaseModel, Runtime

pytestmark = pytest.mark.golden

HERE = Path(__file__).resolve().parent
CASES = sorted(p.name for p in HERE.iterdir() if (p / "input.yaml").is_file())
NAMESPACE = "models"
KUBERNETES_VERSION = "1.33.0"
CONFIG = OperatorConfig(
    images=Images(
        trtfleet="ghcr.io/trtfleet/trtfleet:0.1.0",
        worker="ghcr.io/trtfleet/reference-worker:0.1.0",
        modelopt="ghcr.io/trtfleet/modelopt-example:25.12",
    ),
    image_pull_secrets=("registry-credentials",),
    inference_pool=InferencePoolConfig(picker_service="trtfleet-epp", picker_port=9002),
)


def _uid(name: str) -> str:
    return f"00000000-0000-4000-8000-{sum(name.encode()):012d}"


def render_case(case: str) -> dict[str, dict[str, Any]]:
    docs = list(yaml.safe_load_all((HERE / case / "input.yaml").read_text()))
    base = BaseModel.model_validate(docs[0])
    name = base.metadata["name"]
    owner = owner_reference("BaseModel", API_VERSION, name, _uid(name), controller=True)
    shared = owner_reference("BaseModel", API_VERSION, name, _uid(name), controller=False)
    plan = plan_engine(base.spec)
    out: dict[str, dict[str, Any]] = {}
    if len(docs) == 1:
        assert CONFIG.inference_pool is not None
        out["inference-pool"] = build_inference_pool(
            base.spec, name=serving_name(name), namespace=NAMESPACE, owner=owner, basemodel=name,
            picker=CONFIG.inference_pool,
        )
    if len(docs) == 1 and base.spec.runtime is Runtime.PYTORCH:
        return out | render_pytorch(base, plan, owner=owner, shared=shared)
    if len(docs) == 1:
        if base.spec.runtime.value == "tensorrtllm":
            out["plan-configmap"] = build_plan_configmap(
                plan.engine_hash, plan.plan_json, namespace=NAMESPACE, owners=[shared]
            )
            out["build-job"] = build_engine_job(
                base.spec, engine_hash=plan.engine_hash, namespace=NAMESPACE, owners=[shared], attempt=1, config=CONFIG
            )
            out["build-job-attempt-2"] = build_engine_job(
                base.spec, engine_hash=plan.engine_hash, namespace=NAMESPACE, owners=[shared], attempt=2, config=CONFIG
            )
            out["engine-record"] = build_engine_record(
                plan.engine_hash,
                namespace=NAMESPACE,
                uri=CONFIG.storage.engine_uri(plan.engine_hash),
                image=base.spec.engine.image,
                built_at="2026-11-21T12:00:00Z",
                build_job=out["build-job"]["metadata"]["name"],
            )
        serving = serving_name(name)
        repo = build_model_repo_configmap(
            plan.render_spec,
            name=serving,
            namespace=NAMESPACE,
            owner=owner,
            engine_hash=plan.engine_hash,
            config=CONFIG,
        )
        out["model-repo-configmap"] = repo
        out["deployment"] = build_deployment(
            plan.render_spec,
            name=serving,
            namespace=NAMESPACE,
            owner=owner,
            basemodel=name,
            engine_hash=plan.engine_hash,
            model_repo=repo,
            config=CONFIG,
        )
        out["service"] = build_service(name=serving, namespace=NAMESPACE, owner=owner, basemodel=name)
        out["pdb"] = build_pdb(name=serving, namespace=NAMESPACE, owner=owner, basemodel=name)
        return out
    adapter = Adapter.model_validate(docs[1])
    ad_name = adapter.metadata["name"]
    ad_owner = owner_reference("Adapter", API_VERSION, ad_name, _uid(ad_name), controller=True)
    if adapter.spec.mode is AdapterMode.DYNAMIC:
        if adapter.spec.base_quantization is not None:
            out |= render_variant(base, adapter)
        out["convert-job"] = build_convert_job(
            adapter=ad_name,
            namespace=NAMESPACE,
            owner=ad_owner,
            source=adapter.spec.source,
            source_key=source_key(adapter.spec.source),
            basemodel=name,
            base=base.spec,
            config=CONFIG,
        )
        return out
    merged = plan_merged(base.spec, adapter.spec.source.uri, adapter.spec.source.revision)
    labels = {LABEL_ADAPTER: ad_name, LABEL_BASEMODEL: name}
    ad_shared = owner_reference("Adapter", API_VERSION, ad_name, _uid(ad_name), controller=False)
    if base.spec.runtime is Runtime.PYTORCH:
        return render_pytorch_merged(base, adapter, merged, owner=ad_owner, shared=ad_shared)
    worker_args: tuple[str, ...] = ()
    if base.spec.runtime is Runtime.REFERENCE:  # nothing to build: the worker merges when it starts
        worker_args = tuple(reference_merged_args(adapter.spec.source.uri, adapter.spec.served_name or ad_name))
    else:
        out["build-job"] = build_engine_job(
            base.spec,
            engine_hash=merged.engine_hash,
            namespace=NAMESPACE,
            owners=[ad_shared],
            attempt=1,
            config=CONFIG,
            labels=labels,
            merged_sources=(adapter.spec.source.uri,),
        )
    serving = merged_serving_name(ad_name)
    repo = build_model_repo_configmap(
        merged.render_spec,
        name=serving,
        namespace=NAMESPACE,
        owner=ad_owner,
        engine_hash=merged.engine_hash,
        config=CONFIG,
        labels=labels,
    )
    out["model-repo-configmap"] = repo
    out["deployment"] = build_deployment(
        merged.render_spec,
        name=serving,
        namespace=NAMESPACE,
        owner=ad_owner,
        basemodel=name,
        engine_hash=merged.engine_hash,
        model_repo=repo,
        config=CONFIG,
        adapter=ad_name,
        worker_args=worker_args,
    )
    out["service"] = build_service(name=serving, namespace=NAMESPACE, owner=ad_owner, basemodel=name, adapter=ad_name)
    out["pdb"] = build_pdb(name=serving, namespace=NAMESPACE, owner=ad_owner, basemodel=name, adapter=ad_name)
    return out


def render_pytorch(
    base: BaseModel, plan: EnginePlan, *, owner: dict[str, Any], shared: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """A ``runtime: pytorch`` BaseModel: prepare plan and Jobs, checkpoint record, options, Deployment, Service."""
    name = base.metadata["name"]
    serving = serving_name(name)
    prepare = {"spec": base.spec, "plan": plan, "namespace": NAMESPACE, "owners": [shared], "config": CONFIG}
    options = build_options_configmap(plan, name=serving, namespace=NAMESPACE, owner=owner)
    assert plan.prepare is not None
    serve_dir = plan.prepare.serve_checkpoint_dir
    return {
        "plan-configmap": build_plan_configmap(plan.engine_hash, plan.plan_json, namespace=NAMESPACE, owners=[shared]),
        "prepare-job": build_prepare_job(**prepare, attempt=1),
        "prepare-job-attempt-2": build_prepare_job(**prepare, attempt=2),
        "checkpoint-record": build_engine_record(
            plan.engine_hash,
            namespace=NAMESPACE,
            uri=f"pvc://{CONFIG.storage.engine_pvc}/{serve_dir.removeprefix(MODEL_CACHE_MOUNT).lstrip('/')}",
            image=base.spec.engine.image,
            built_at="2026-11-21T12:00:00Z",
            build_job=prepare_job_name(plan.engine_hash),
        ),
        "options-configmap": options,
        "deployment": build_pytorch_deployment(
            base.spec, plan, name=serving, namespace=NAMESPACE, owner=owner, basemodel=name, options=options,
            config=CONFIG,
        ),
        "service": build_service(
            name=serving, namespace=NAMESPACE, owner=owner, basemodel=name, runtime=base.spec.runtime,
            server=base.spec.serving.server,
        ),
        "pdb": build_pdb(name=serving, namespace=NAMESPACE, owner=owner, basemodel=name),
    }


def render_pytorch_merged(
    base: BaseModel, adapter: Adapter, plan: EnginePlan, *, owner: dict[str, Any], shared: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """A merged Adapter on a ``runtime: pytorch`` BaseModel: its prepare plan and Job, options, Deployment."""
    name, ad_name = base.metadata["name"], adapter.metadata["name"]
    serving = merged_serving_name(ad_name)
    labels = {LABEL_ADAPTER: ad_name, LABEL_BASEMODEL: name}
    options = build_options_configmap(plan, name=serving, namespace=NAMESPACE, owner=owner)
    return {
        "plan-configmap": build_plan_configmap(plan.engine_hash, plan.plan_json, namespace=NAMESPACE, owners=[shared]),
        "prepare-job": build_prepare_job(
            base.spec, plan, namespace=NAMESPACE, owners=[shared], attempt=1, config=CONFIG, labels=labels,
            merged_sources=(adapter.spec.source.uri,),
        ),
        "options-configmap": options,
        "deployment": build_pytorch_deployment(
            plan.render_spec, plan, name=serving, namespace=NAMESPACE, owner=owner, basemodel=name, options=options,
            config=CONFIG, adapter=ad_name, served_name=adapter.spec.served_name or ad_name,
        ),
        "service": build_service(
            name=serving, namespace=NAMESPACE, owner=owner, basemodel=name, adapter=ad_name,
            runtime=base.spec.runtime, server=base.spec.serving.server,
        ),
        "pdb": build_pdb(name=serving, namespace=NAMESPACE, owner=owner, basemodel=name, adapter=ad_name),
    }


def render_variant(base: BaseModel, adapter: Adapter) -> dict[str, dict[str, Any]]:
    """A QLoRA Adapter's base variant: its build (or prepare) plan and Job, configuration, Deployment, Service
    and PDB, owned by the Adapter (and by every other Adapter trained alike)."""
    quantization = adapter.spec.base_quantization
    assert quantization is not None
    name, ad_name = base.metadata["name"], adapter.metadata["name"]
    plan = plan_variant(base.spec, quantization)
    ad_shared = owner_reference("Adapter", API_VERSION, ad_name, _uid(ad_name), controller=False)
    want = VariantWant(ad_shared, name, plan.engine_hash, variant_serving_name(name, plan.engine_hash))
    labels = {LABEL_BASEMODEL: name, LABEL_VARIANT: want.serving}
    out: dict[str, dict[str, Any]] = {}
    if base.spec.runtime is not Runtime.REFERENCE:
        out["variant-plan-configmap"] = build_plan_configmap(
            plan.engine_hash, plan.plan_json, namespace=NAMESPACE, owners=[ad_shared]
        )
        job = build_prepare_job if base.spec.runtime is Runtime.PYTORCH else build_engine_job_of_plan
        out["variant-build-job"] = job(
            base.spec, plan, namespace=NAMESPACE, owners=[ad_shared], attempt=1, config=CONFIG, labels=labels
        )
    service, pdb = variant_service_and_pdb(base.spec, want, NAMESPACE)
    config_map, deployment = variant_deployment(plan, base.spec, quantization, want, NAMESPACE, CONFIG)
    out |= {"variant-service": service, "variant-pdb": pdb, "variant-config": config_map,
            "variant-deployment": deployment}
    return out


def build_engine_job_of_plan(spec: Any, plan: EnginePlan, **kwargs: Any) -> dict[str, Any]:
    return build_engine_job(spec, engine_hash=plan.engine_hash, **kwargs)


def dump(obj: dict[str, Any]) -> str:
    return yaml.safe_dump(obj, sort_keys=True, default_flow_style=False, width=110)


def test_cases_exist() -> None:
    assert {
        "llama3-8b-h100",
        "tiny-reference",
        "llama70b-tp2-pvc",
        "adapter-llama3-sql",
        "adapter-tiny-json",
        "adapter-merged",
        "adapter-merged-reference",
        "adapter-merged-pytorch",
        "pytorch-llama3-8b",
        "pytorch-llama70b-fp8-tp2",
        "adapter-pytorch-sql",
        "pytorch-llama3-8b-triton",
        "adapter-qlora",
        "adapter-qlora-reference",
        "adapter-qlora-pytorch",
    } <= set(CASES)


@pytest.mark.parametrize("case", CASES)
def test_golden(case: str, update_golden: bool) -> None:
    objects = render_case(case)
    for obj in objects.values():
        if obj["kind"] == "InferencePool":
            inferencepool.validate(obj)
        else:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    assert render_case(case) == objects, "builders must be deterministic"
    files = {f"{name}.yaml": dump(obj) for name, obj in objects.items()}
    check_golden_dir(HERE / case / "expected", files, update=update_golden, case=case)


def pod_spec_of(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The pod spec of a Job or Deployment (their templates), None for other kinds."""
    if obj["kind"] not in ("Job", "Deployment"):
        return None
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    return spec


@pytest.mark.parametrize("case", CASES)
def test_every_pod_pulls_with_the_configured_secrets(case: str) -> None:
    """A private registry reaches every pod the operator creates: build, prepare and convert Jobs and serving
    Deployments alike (the chart passes its ``imagePullSecrets`` as ``--image-pull-secret``)."""
    pods = {name: spec for name, obj in render_case(case).items() if (spec := pod_spec_of(obj)) is not None}
    assert pods, f"{case} builds no pod"
    for name, spec in pods.items():
        assert spec["imagePullSecrets"] == [{"name": "registry-credentials"}], (case, name)


@pytest.mark.parametrize("case", CASES)
def test_the_pool_selects_every_serving_pod_on_its_http_port_and_no_job(case: str) -> None:
    """Base, merged and variant pods are the BaseModel's pool's, on the port the picker routes to; build, prepare
    and convert pods are not."""
    base = BaseModel.model_validate(next(yaml.safe_load_all((HERE / case / "input.yaml").read_text())))
    selector = pool_selector(base.metadata["name"]).items()
    for name, obj in render_case(case).items():
        template = obj["spec"]["template"] if obj["kind"] in ("Job", "Deployment") else None
        if template is None:
            continue
        selected = selector <= template["metadata"]["labels"].items()
        assert selected == (obj["kind"] == "Deployment"), (case, name)
        if selected:
            ports = [p for c in template["spec"]["containers"] for p in c.get("ports", ()) if p["name"] == "http"]
            assert [p["containerPort"] for p in ports] == [http_port(base.spec)], (case, name)


def test_inferencepool_schema_refuses_unknown_fields() -> None:
    """The golden check above is strict: a field GIE's CRD does not define fails."""
    pool = yaml.safe_load((HERE / "tiny-reference" / "expected" / "inference-pool.yaml").read_text())
    inferencepool.validate(pool)
    pool["spec"]["endpointPickerRef"]["namespace"] = "elsewhere"
    with pytest.raises(jsonschema.ValidationError, match="namespace"):
        inferencepool.validate(pool)
