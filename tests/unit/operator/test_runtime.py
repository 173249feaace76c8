"""The operator's I/O shell over :class:`FakeKube` (the :class:`KubeVerbs` Protocol): the order and failure rules
of :meth:`OperatorRuntime.act`, task ids taken once per (Adapter, source) and written with a guarded status
patch, and triggers that coalesce."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from trtfleet_operator import metrics
from trtfleet_operator.artifacts import ArtifactSummary
from trtfleet_operator.config import OperatorConfig
from trtfleet_operator.errors import ConflictError, InvalidError, KubeError
from trtfleet_operator.kube import object_path, path_of
from trtfleet_operator.reconcile.adapter import reconcile_adapter
from trtfleet_operator.reconcile.types import AdapterObserved, Event, ObjectRef, Reconciliation, SetOwners
from trtfleet_operator.runtime import OperatorRuntime

from tests.unit.operator.fakes import CounterStore, FakeKube
from tests.unit.operator.helpers import NAMESPACE, NOW, Obj, adapter, by_kind, job_pod, job_status, llama
from trtfleet.api import API_VERSION
from trtfleet.api.adapter import AdapterStatus

CONFIG = OperatorConfig()
SUMMARY = ArtifactSummary(16, ("attn_k", "attn_q", "attn_v"), "ab" * 32, 123456, "float16").to_json()

BASE_PATH = object_path(API_VERSION, "BaseModel", NAMESPACE, "llama3-8b")
JOB_PATH = object_path("batch/v1", "Job", NAMESPACE, "trtfleet-build-0123")
PLAN_PATH = object_path("v1", "ConfigMap", NAMESPACE, "trtfleet-plan-0123")
OLD_PLAN_PATH = object_path("v1", "ConfigMap", NAMESPACE, "trtfleet-plan-old")


def runtime_over(kube: FakeKube, store: CounterStore | None = None) -> OperatorRuntime:
    return OperatorRuntime(CONFIG, kube, store or CounterStore(), clock=lambda: NOW)


async def until(done: Callable[[], bool], *, turns: int = 1000) -> bool:
    """Yield to the event loop until ``done()`` (False if it never became true within ``turns`` turns)."""
    for _ in range(turns):
        if done():
            return True
        await asyncio.sleep(0)
    return done()


async def settle(turns: int = 2000) -> None:
    """Let the event loop run ``turns`` turns, in which every reconcile triggered without a delay ends (the fake
    answers at once)."""
    for _ in range(turns):
        await asyncio.sleep(0)


def configmap(name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": NAMESPACE}, "data": {}}


def world() -> tuple[FakeKube, Obj, Reconciliation]:
    """A BaseModel, one build Job it should own and a stale plan; the Reconciliation that does every kind of act."""
    kube = FakeKube()
    base = kube.put(llama())
    job = kube.put({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "trtfleet-build-0123",
                                                                          "namespace": NAMESPACE}})
    kube.put(configmap("trtfleet-plan-old"))
    owner = {"apiVersion": API_VERSION, "kind": "BaseModel", "name": "llama3-8b", "uid": base["metadata"]["uid"]}
    result = Reconciliation(
        status={**(base.get("status") or {}), "phase": "Building"},
        apply=(configmap("trtfleet-plan-0123"),),
        set_owners=(SetOwners(ObjectRef.of(job), (owner,), job["metadata"]["resourceVersion"]),),
        events=(Event("Normal", "BuildStarted", "started"),),
        delete=(ObjectRef("v1", "ConfigMap", NAMESPACE, "trtfleet-plan-old"),),
        counters=("build_started",),
    )
    return kube, base, result


EVERY_ACT = (
    ("apply", PLAN_PATH),
    ("patch", JOB_PATH),
    ("patch-status", BASE_PATH),
    ("event", BASE_PATH),
    ("delete", OLD_PLAN_PATH),
)


@dataclass(frozen=True)
class ActCase:
    name: str
    failures: dict[tuple[str, str], KubeError] = field(default_factory=dict)
    """The calls the API server refuses, once each."""
    stale_handover: bool = False
    """The Job changed since the reconcile read it (its resourceVersion in the hand-over is old)."""
    job_gone: bool = False
    sent: tuple[tuple[str, str], ...] = EVERY_ACT
    """What act sends, in order."""
    raises: type[KubeError] | None = None
    retriggered: bool = False


ACT_CASES = [
    ActCase("every act succeeds: applies, hand-overs, status, events, deletions, in that order"),
    ActCase(
        "a failed apply does not stop the rest, and is raised at the end",
        failures={("apply", PLAN_PATH): InvalidError(422, "Invalid", "spec.template: Required value")},
        raises=InvalidError,
    ),
    ActCase("a hand-over that lost to a concurrent write reconciles again", stale_handover=True, retriggered=True),
    ActCase("a hand-over of a Job gone since is let go", job_gone=True),
    ActCase(
        "a hand-over the server refuses otherwise is raised at the end",
        failures={("patch", JOB_PATH): KubeError(500, "InternalError", "etcd timeout")},
        raises=KubeError,
    ),
    ActCase(
        "a failed status patch is raised at once: no events, no deletions",
        failures={("patch-status", BASE_PATH): ConflictError(409, "Conflict", "the object has been modified")},
        sent=EVERY_ACT[:3],
        raises=ConflictError,
    ),
    ActCase(
        "an event that cannot be recorded is let go",
        failures={("event", BASE_PATH): KubeError(403, "Forbidden", "events is forbidden")},
    ),
    ActCase(
        "a failed deletion is raised at the end",
        failures={("delete", OLD_PLAN_PATH): KubeError(500, "InternalError", "etcd timeout")},
        raises=KubeError,
    ),
    ActCase(
        "of several failures the first is raised",
        failures={
            ("apply", PLAN_PATH): InvalidError(422, "Invalid", "first"),
            ("delete", OLD_PLAN_PATH): KubeError(500, "InternalError", "second"),
        },
        raises=InvalidError,
    ),
]


@pytest.mark.parametrize("case", ACT_CASES, ids=lambda c: c.name)
def test_act(case: ActCase) -> None:
    kube, base, result = world()
    kube.failures.update(case.failures)
    if case.stale_handover:
        kube.put(kube.objects[JOB_PATH])  # somebody wrote the Job: a new resourceVersion
    if case.job_gone:
        del kube.objects[JOB_PATH]

    async def main() -> tuple[list[tuple[str, str]], KubeError | None, bool]:
        runtime = runtime_over(kube)
        raised: KubeError | None = None
        try:
            await runtime.act(base, result, ("phase",))
        except KubeError as exc:
            raised = exc
        sent = kube.verbs()
        again = await until(lambda: ("get", BASE_PATH) in kube.verbs())
        await runtime.close()
        return sent, raised, again

    sent, raised, again = asyncio.run(main())
    assert sent == list(case.sent)
    assert type(raised) is case.raises if case.raises else raised is None
    assert again == case.retriggered


def test_act_patches_only_the_status_keys_that_changed() -> None:
    kube, base, _ = world()
    base["status"] = {"phase": "Pending", "replicas": 2, "engine": {"hash": "a"}}
    wanted = {"phase": "Pending", "replicas": 3, "selector": "x=y"}
    keys = ("phase", "replicas", "engine", "selector")
    asyncio.run(runtime_over(kube).act(base, Reconciliation(status=wanted), keys))
    assert [c.body for c in kube.calls if c.verb == "patch-status"] == [
        {"status": {"replicas": 3, "engine": None, "selector": "x=y"}}
    ]


def test_act_sends_no_status_patch_when_nothing_changed() -> None:
    kube, base, _ = world()
    base["status"] = {"phase": "Ready"}
    asyncio.run(runtime_over(kube).act(base, Reconciliation(status={"phase": "Ready"}), ("phase",)))
    assert kube.calls == []


def test_a_guarded_status_patch_carries_the_resource_version_read() -> None:
    kube, base, _ = world()
    read = base["metadata"]["resourceVersion"]
    asyncio.run(runtime_over(kube).act(base, Reconciliation(status={"phase": "Ready"}), ("phase",), guard_status=True))
    patch = next(c.body for c in kube.calls if c.verb == "patch-status")
    assert patch == {"status": {"phase": "Ready"}, "metadata": {"resourceVersion": read}}
    kube.put(kube.objects[BASE_PATH])  # written by somebody else
    with pytest.raises(ConflictError):
        asyncio.run(
            runtime_over(kube).act(base, Reconciliation(status={"phase": "Failed"}), ("phase",), guard_status=True)
        )


def test_act_counts_applies_and_builds() -> None:
    kube, base, result = world()

    def sample(name: str, labels: dict[str, str]) -> float:
        return metrics.REGISTRY.get_sample_value(name, labels) or 0.0

    applies = sample("trtfleet_operator_applies_total", {"object_kind": "ConfigMap"})
    started = sample("trtfleet_operator_builds_total", {"result": "started"})
    asyncio.run(runtime_over(kube).act(base, result, ("phase",)))
    assert sample("trtfleet_operator_applies_total", {"object_kind": "ConfigMap"}) == applies + 1
    assert sample("trtfleet_operator_builds_total", {"result": "started"}) == started + 1


def test_a_requeue_reconciles_the_object_again_after_its_delay() -> None:
    kube, base, _ = world()

    async def main() -> bool:
        runtime = runtime_over(kube)
        await runtime.act(base, Reconciliation(status={}, requeue_after_s=0.01), ("phase",))
        assert ("get", BASE_PATH) not in kube.verbs()  # not before the delay
        seen = await until(lambda: ("get", BASE_PATH) in kube.verbs(), turns=10**6)
        await runtime.close()
        return seen

    assert asyncio.run(main())


# ---------------------------------------------------------------------------------------------- task ids
ADAPTER_PATH = object_path(API_VERSION, "Adapter", NAMESPACE, "sql")


def converted(name: str = "sql", task_id: int | None = None) -> Obj:
    """An Adapter whose convert Job succeeded and was deleted: its status describes the artifact."""
    obj, base = adapter(name=name), llama()
    job = by_kind(reconcile_adapter(obj, AdapterObserved(basemodel=base), CONFIG, NOW).apply, "Job")[0]
    observed = AdapterObserved(
        basemodel=base,
        convert_jobs=(job_status(job, "complete"),),
        convert_pods=(job_pod(job, "convert", exit_code=0, message=SUMMARY),),
    )
    status = reconcile_adapter(obj, observed, CONFIG, NOW, task_id=task_id).status
    assert status["phase"] == ("Converting" if task_id is None else "Ready") and "artifact" in status
    return {**obj, "status": status}


def status_of(kube: FakeKube, path: str) -> Obj:
    status = kube.objects[path].get("status") or {}
    AdapterStatus.model_validate(status)
    return status


def test_a_converted_adapter_gets_one_task_id_in_a_guarded_status_patch() -> None:
    kube, store = FakeKube(), CounterStore()
    kube.put(llama())
    read = kube.put(converted())["metadata"]["resourceVersion"]
    assert "taskId" not in status_of(kube, ADAPTER_PATH)
    result = asyncio.run(runtime_over(kube, store).reconcile_adapter(NAMESPACE, "sql"))
    assert result is not None and result.status["phase"] == "Ready"
    assert status_of(kube, ADAPTER_PATH)["taskId"] == 1 and store.next_ids[(NAMESPACE, "llama3-8b")] == 2
    patch = next(c.body for c in kube.calls if c.verb == "patch-status")
    assert patch["metadata"] == {"resourceVersion": read}


def test_ids_start_above_the_largest_one_an_adapter_shows() -> None:
    """A counter that went backwards (a restored backup) does not hand out an id an Adapter holds."""
    kube, store = FakeKube(), CounterStore()
    kube.put(llama())
    kube.put(converted("old", task_id=9))
    kube.put(converted())

    async def main() -> None:
        runtime = runtime_over(kube, store)
        await runtime.reconcile_adapter(NAMESPACE, "old")
        await runtime.reconcile_adapter(NAMESPACE, "sql")

    asyncio.run(main())
    assert store.reads == 1  # only "sql" needed an id
    assert status_of(kube, ADAPTER_PATH)["taskId"] == 10


def test_an_id_whose_status_write_failed_is_reused_by_the_retry() -> None:
    kube, store = FakeKube(), CounterStore()
    kube.put(llama())
    kube.put(converted())
    kube.failures[("patch-status", ADAPTER_PATH)] = ConflictError(409, "Conflict", "the object has been modified")

    async def main() -> None:
        runtime = runtime_over(kube, store)
        with pytest.raises(ConflictError):
            await runtime.reconcile_adapter(NAMESPACE, "sql")
        await runtime.reconcile_adapter(NAMESPACE, "sql")

    asyncio.run(main())
    assert store.reads == 1 and store.next_ids[(NAMESPACE, "llama3-8b")] == 2
    assert status_of(kube, ADAPTER_PATH)["taskId"] == 1


# ---------------------------------------------------------------------------------------------- scheduling
def test_triggers_before_a_reconcile_starts_make_one_reconcile() -> None:
    kube = FakeKube()
    kube.put(llama())

    def reconciles() -> int:
        return kube.verbs().count(("get", BASE_PATH))

    async def main() -> tuple[int, int]:
        runtime = runtime_over(kube)
        for _ in range(3):
            runtime.trigger("BaseModel", NAMESPACE, "llama3-8b")
        await settle()
        first = reconciles()
        runtime.trigger("BaseModel", NAMESPACE, "llama3-8b")
        await settle()
        await runtime.close()
        return first, reconciles()

    assert asyncio.run(main()) == (1, 2)


def test_a_missing_or_deleting_object_is_not_reconciled() -> None:
    kube = FakeKube()
    kube.put(llama(name="going", deleting=True))
    runtime = runtime_over(kube)
    assert asyncio.run(runtime.reconcile_basemodel(NAMESPACE, "gone")) is None
    assert asyncio.run(runtime.reconcile_basemodel(NAMESPACE, "going")) is None
    assert kube.verbs() == [
        ("get", object_path(API_VERSION, "BaseModel", NAMESPACE, name)) for name in ("gone", "going")
    ]


def test_the_fake_stores_what_it_is_given() -> None:
    """The fake's own rules the tests above rest on: merge patches, the compare-and-swap, selectors, deletes."""
    kube = FakeKube()
    cm = kube.put({**configmap("a"), "metadata": {**configmap("a")["metadata"], "labels": {"k": "v"}}})
    path = path_of(cm)

    async def main() -> None:
        read = {"resourceVersion": cm["metadata"]["resourceVersion"]}
        assert (await kube.patch_merge(path, {"data": {"x": "1", "y": "2"}, "metadata": read}))["data"] == {
            "x": "1",
            "y": "2",
        }
        with pytest.raises(ConflictError):
            await kube.patch_merge(path, {"data": {"x": "3"}, "metadata": read})
        assert (await kube.patch_merge(path, {"data": {"x": None}}))["data"] == {"y": "2"}
        collection = path.rsplit("/", 1)[0]
        assert [o["metadata"]["name"] for o in await kube.list(collection, label_selector="k in (u,v)")] == ["a"]
        assert await kube.list(collection, label_selector="k=u") == []
        assert not await kube.delete(path, uid="someone-else")
        assert await kube.delete(path, uid=cm["metadata"]["uid"])
        assert await kube.get(path) is None

    asyncio.run(main())
