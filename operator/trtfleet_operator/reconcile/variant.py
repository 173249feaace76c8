"""QLoRA base variants (pure): the BaseModel dequantized as an Adapter's ``training.baseQuantization`` says.

A QLoRA adapter learned against the base model as bitsandbytes quantized it, so it is served hot-swapped
(``mode: dynamic``: convert Job and task id as usual) on pods of their own whose weights are that base:
every decoder linear weight quantized and dequantized exactly as bitsandbytes does. One variant per
(BaseModel, quantization), shared by every Adapter trained the same way:

* plan: :func:`trtfleet_operator.planning.plan_variant` (hash = base engine identity + quantization; on
  ``pytorch`` the prepare hash); one build or prepare Job per hash, owned by every Adapter that wants it;
  ``runtime: reference`` builds nothing, its worker dequantizes when it starts (``--base-quantization``);
* serving: a Deployment, headless Service and PDB named :func:`~trtfleet_operator.names.variant_serving_name`,
  labelled ``trtfleet.io/role=variant`` and ``trtfleet.io/variant=<name>`` (never selected as the base
  pool), owned by every Adapter it serves, so Kubernetes removes them with the last one; a variant nobody
  wants any more (the BaseModel changed) is deleted by the Adapters that owned it;
* one replica (none when the BaseModel is scaled to zero): variant pods serve only their QLoRA adapters.

The Adapter says which variant serves it in ``status.baseVariant`` and its readiness in the
``BaseVariantReady`` condition; the router sends the adapter only to that variant's pods.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from pydantic import ValidationError

from trtfleet.api import AdapterSpec, BaseModelSpec, BaseQuantizationSpec, Runtime
from trtfleet_operator import conditions as cond
from trtfleet_operator.builders.pytorch import build_options_configmap, build_pytorch_deployment
from trtfleet_operator.builders.service import build_pdb, build_service
from trtfleet_operator.builders.serving import (
    build_deployment,
    build_model_repo_configmap,
    reference_variant_args,
)
from trtfleet_operator.config import OperatorConfig
from trtfleet_operator.errors import PlanningError
from trtfleet_operator.names import (
    LABEL_BASEMODEL,
    LABEL_VARIANT,
    label_value,
    model_repo_configmap_name,
    options_configmap_name,
    variant_serving_name,
)
from trtfleet_operator.planning import EnginePlan, plan_variant
from trtfleet_operator.reconcile.common import NOT_NEEDED, engine_inputs, hash_owners, shared_owner
from trtfleet_operator.reconcile.engine import (
    CHECKPOINT_PREPARE,
    EngineOutcome,
    reconcile_engine,
    release_stale,
    rfc3339,
)
from trtfleet_operator.reconcile.events import status_events
from trtfleet_operator.reconcile.serving import serving_state
from trtfleet_operator.reconcile.types import (
    AdapterObserved,
    Counter,
    Obj,
    ObjectRef,
    Reconciliation,
    SetOwners,
    job_snapshot,
)

BASE_VARIANT_READY = cond.BASE_VARIANT_READY
VARIANT_NOT_PLANNED = "VariantNotPlanned"
VARIANT_REPLICAS = 1


@dataclass(frozen=True)
class VariantWant:
    """One Adapter's wish: the variant ``serving`` (of BaseModel ``basemodel``) with content hash ``variant_hash``."""

    owner: Obj
    basemodel: str
    variant_hash: str
    serving: str


def wanted_variant(adapter: Obj, basemodels: Sequence[Obj]) -> VariantWant | None:
    """The variant a QLoRA Adapter wants, or None (not QLoRA, being deleted, no such BaseModel, unplannable)."""
    if (adapter.get("metadata") or {}).get("deletionTimestamp"):
        return None
    try:
        spec = AdapterSpec.model_validate(adapter.get("spec"))
        quantization = spec.base_quantization
        base_obj = next((b for b in basemodels if b["metadata"]["name"] == spec.base_model), None)
        if quantization is None or base_obj is None:
            return None
        variant_hash = plan_variant(BaseModelSpec.model_validate(base_obj.get("spec")), quantization).engine_hash
    except (ValidationError, PlanningError):
        return None
    serving = variant_serving_name(spec.base_model, variant_hash)
    return VariantWant(shared_owner(adapter), spec.base_model, variant_hash, serving)


def variant_wants(adapters: Sequence[Obj], basemodels: Sequence[Obj]) -> list[VariantWant]:
    wants = (wanted_variant(a, basemodels) for a in sorted(adapters, key=lambda a: str(a["metadata"]["name"])))
    return [w for w in wants if w is not None]


@dataclass(frozen=True)
class VariantOutcome:
    condition: cond.Condition
    status: Obj | None
    apply: tuple[Obj, ...] = ()
    delete: tuple[ObjectRef, ...] = ()
    set_owners: tuple[SetOwners, ...] = ()
    counters: tuple[Counter, ...] = ()
    requeue_after_s: float | None = None


def _owned_by(obj: Obj, owners: Sequence[Obj]) -> Obj:
    """``obj`` owned by every Adapter the variant serves (none of them its controller)."""
    return {**obj, "metadata": {**obj["metadata"], "ownerReferences": [dict(o) for o in owners]}}


def reconcile_variant(
    obj: Obj,
    spec: AdapterSpec,
    quantization: BaseQuantizationSpec,
    base: BaseModelSpec,
    observed: AdapterObserved,
    config: OperatorConfig,
    now: datetime,
) -> VariantOutcome:
    meta = obj["metadata"]
    namespace, uid = meta["namespace"], meta["uid"]
    generation = int(meta.get("generation") or 0)
    jobs = [job_snapshot(j) for j in observed.build_jobs]
    wants = variant_wants(observed.qlora_adapters, observed.basemodels)
    users: dict[str, list[Obj]] = {}
    for want in wants:
        users.setdefault(want.variant_hash, []).append(want.owner)
    try:
        plan = plan_variant(base, quantization)
    except PlanningError as exc:
        deletes, handovers = release_stale(uid, None, jobs, observed.plan_configmaps, users)
        message = (f"the {quantization.variant_text()} base variant of BaseModel {spec.base_model} cannot be "
                   f"planned: {exc}")
        return VariantOutcome(
            cond.make(BASE_VARIANT_READY, cond.FALSE, exc.reason, message, generation=generation),
            None,
            delete=tuple(deletes),
            set_owners=tuple(handovers),
        )
    reference = base.runtime is Runtime.REFERENCE
    me = VariantWant(shared_owner(obj), spec.base_model, plan.engine_hash,
                     variant_serving_name(spec.base_model, plan.engine_hash))
    owners = hash_owners(users, plan.engine_hash, me.owner)
    deletes, handovers = release_stale(uid, None if reference else plan.engine_hash, jobs, observed.plan_configmaps,
                                       users)
    labels = {LABEL_BASEMODEL: label_value(spec.base_model), LABEL_VARIANT: label_value(me.serving)}
    engine = _reference_engine(quantization) if reference else reconcile_engine(
        engine_inputs(
            namespace, plan, base, owners, jobs, observed.plan_configmaps, observed.engine_records,
            observed.build_pods, labels=labels, kind=CHECKPOINT_PREPARE if base.runtime is Runtime.PYTORCH else None,
        ),
        config,
        now,
    )
    status: Obj = {"name": me.serving, "hash": plan.engine_hash, "quantization": quantization.variant_text()}
    service, pdb = variant_service_and_pdb(base, me, namespace)
    applies = [_owned_by(service, owners), _owned_by(pdb, owners), *engine.apply]
    stale = _stale_variants(uid, me, wants, observed.variant_deployments, namespace)
    observed_deployment = next(
        (d for d in observed.variant_deployments if d["metadata"]["name"] == me.serving), None
    )
    if engine.state == "built":
        config_map, desired = variant_deployment(plan, base, quantization, me, namespace, config)
        applies += [_owned_by(config_map, owners), _owned_by(desired, owners)]
        was_ready = (cond.find((obj.get("status") or {}).get("conditions"), BASE_VARIANT_READY) or {}).get("status")
        state = serving_state(desired, observed_deployment, was_serving=was_ready == cond.TRUE)
        condition = {**state.condition, "type": BASE_VARIANT_READY, "observedGeneration": generation}
        condition["message"] = f"base variant {me.serving} ({status['quantization']}): {condition['message']}"
    else:
        condition = cond.make(BASE_VARIANT_READY, cond.FALSE, engine.condition["reason"],
                              f"base variant {me.serving}: {engine.condition['message']}", generation=generation)
    return VariantOutcome(
        condition,
        status,
        apply=tuple(applies),
        delete=(*engine.delete, *deletes, *stale),
        set_owners=(*engine.set_owners, *handovers),
        counters=tuple(engine.counters),
        requeue_after_s=engine.requeue_after_s,
    )


def _reference_engine(quantization: BaseQuantizationSpec) -> EngineOutcome:
    message = (f"runtime reference dequantizes the base as {quantization.variant_text()} when the worker starts "
               "(trtfleet worker --base-quantization); nothing to build")
    return EngineOutcome("built", cond.make(cond.ENGINE_BUILT, cond.TRUE, NOT_NEEDED, message), {})


def variant_service_and_pdb(base: BaseModelSpec, want: VariantWant, namespace: str) -> tuple[Obj, Obj]:
    serving, owner, basemodel = want.serving, want.owner, want.basemodel
    return (
        build_service(name=serving, namespace=namespace, owner=owner, basemodel=basemodel, variant=serving,
                      runtime=base.runtime, server=base.serving.server),
        build_pdb(name=serving, namespace=namespace, owner=owner, basemodel=basemodel, variant=serving),
    )


def variant_deployment(
    plan: EnginePlan,
    base: BaseModelSpec,
    quantization: BaseQuantizationSpec,
    want: VariantWant,
    namespace: str,
    config: OperatorConfig,
) -> tuple[Obj, Obj]:
    """The variant pods' configuration and Deployment, served under the BaseModel's name with LoRA on."""
    serving, owner = want.serving, want.owner
    replicas = min(base.serving.replicas, VARIANT_REPLICAS)
    if base.runtime is Runtime.PYTORCH:
        options = build_options_configmap(plan, name=serving, namespace=namespace, owner=owner)
        return options, build_pytorch_deployment(
            plan.render_spec, plan, name=serving, namespace=namespace, owner=owner, basemodel=want.basemodel,
            options=options, config=config, variant=serving, replicas=replicas,
        )
    labels = {LABEL_BASEMODEL: label_value(want.basemodel), LABEL_VARIANT: label_value(serving)}
    model_repo = build_model_repo_configmap(
        plan.render_spec, name=serving, namespace=namespace, owner=owner, engine_hash=plan.engine_hash,
        config=config, labels=labels,
    )
    reference = base.runtime is Runtime.REFERENCE
    return model_repo, build_deployment(
        plan.render_spec, name=serving, namespace=namespace, owner=owner, basemodel=want.basemodel,
        engine_hash=plan.engine_hash, model_repo=model_repo, config=config, variant=serving, replicas=replicas,
        worker_args=tuple(reference_variant_args(quantization.variant_text())) if reference else (),
    )


def _stale_variants(
    uid: str, me: VariantWant, wants: Sequence[VariantWant], deployments: Sequence[Obj], namespace: str
) -> tuple[ObjectRef, ...]:
    """The serving objects of variants this Adapter owns that nobody wants any more (its BaseModel changed)."""
    wanted = {w.serving for w in wants} | {me.serving}
    refs: list[ObjectRef] = []
    for deployment in deployments:
        meta = deployment["metadata"]
        owned = any(o.get("uid") == uid for o in meta.get("ownerReferences") or [])
        if meta["name"] in wanted or not owned or meta.get("deletionTimestamp"):
            continue
        serving = meta["name"]
        refs += [
            ObjectRef.of(deployment),
            ObjectRef("v1", "Service", namespace, serving),
            ObjectRef("policy/v1", "PodDisruptionBudget", namespace, serving),
            ObjectRef("v1", "ConfigMap", namespace, model_repo_configmap_name(serving)),
            ObjectRef("v1", "ConfigMap", namespace, options_configmap_name(serving)),
        ]
    return tuple(refs)


def with_variant(obj: Obj, result: Reconciliation, variant: VariantOutcome, now: datetime) -> Reconciliation:
    """``result`` (the Adapter's dynamic reconcile) plus its variant's objects, condition and status."""
    old_conditions = (obj.get("status") or {}).get("conditions")
    conditions = cond.merge(old_conditions, [*result.status["conditions"], variant.condition], now=rfc3339(now))
    status = {**result.status, "conditions": conditions}
    if variant.status is not None:
        status["baseVariant"] = variant.status
    prior = [c for c in old_conditions or () if c.get("type") == BASE_VARIANT_READY]
    events, counters = status_events({"conditions": prior}, {"conditions": [variant.condition]})
    requeues = [s for s in (result.requeue_after_s, variant.requeue_after_s) if s is not None]
    return replace(
        result,
        status=status,
        apply=(*result.apply, *variant.apply),
        delete=(*result.delete, *variant.delete),
        set_owners=(*result.set_owners, *variant.set_owners),
        events=(*result.events, *events),
        counters=(*result.counters, *variant.counters, *counters),
        requeue_after_s=min(requeues) if requeues else None,
    )
