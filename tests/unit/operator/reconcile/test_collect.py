"""Collecting a deleted Adapter's artifact and unused engines (pure decisions)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from trtfleet_operator.config import OperatorConfig
from trtfleet_operator.reconcile.collect import collect_adapter_artifact, collect_engine, used_hashes, volume_path

from tests.unit.operator.helpers import NOW, Obj, adapter

CONFIG = OperatorConfig(artifact_drain_s=60, engine_retention_s=3600)
URI = "pvc://trtfleet-adapters/abc-float16-peft"


def deleted(name: str = "sql", *, uri: str = URI, key: str = "abc", ago_s: float = 120) -> Obj:
    obj = adapter(name=name, status={"phase": "Ready", "artifact": {"uri": uri}, "sourceKey": key})
    obj["metadata"]["deletionTimestamp"] = (NOW - timedelta(seconds=ago_s)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return obj


def finished_job(*, succeeded: bool) -> Obj:
    condition = "Complete" if succeeded else "Failed"
    return {"metadata": {"name": "trtfleet-collect-x", "namespace": "models"},
            "status": {"conditions": [{"type": condition, "status": "True"}]}}


def test_volume_paths() -> None:
    assert volume_path(URI) == ("trtfleet-adapters", "abc-float16-peft")
    assert volume_path("s3://bucket/a") is None and volume_path("pvc://claim") is None


def test_an_adapter_drains_then_its_artifact_is_removed_by_a_job_then_it_goes() -> None:
    draining = collect_adapter_artifact(deleted(ago_s=20), [], None, now=NOW, config=CONFIG)
    assert not draining.done and draining.create is None and draining.retry_after_s == pytest.approx(40)
    start = collect_adapter_artifact(deleted(), [], None, now=NOW, config=CONFIG)
    assert not start.done and start.create is not None
    container = start.create["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["--remove", "abc-float16-peft"]
    assert start.create["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == (
        "trtfleet-adapters")
    assert start.create["metadata"]["ownerReferences"][0]["kind"] == "Adapter"
    running = collect_adapter_artifact(deleted(), [], {"metadata": {"name": "j"}, "status": {"active": 1}},
                                       now=NOW, config=CONFIG)
    assert not running.done and running.create is None
    assert collect_adapter_artifact(deleted(), [], finished_job(succeeded=True), now=NOW, config=CONFIG).done
    failed = collect_adapter_artifact(deleted(), [], finished_job(succeeded=False), now=NOW, config=CONFIG)
    assert failed.done and failed.warning and "left" in failed.message


def test_a_shared_artifact_is_kept() -> None:
    other = adapter(name="sql-v2", status={"phase": "Ready", "artifact": {"uri": URI}, "sourceKey": "abc"})
    converting = adapter(name="sql-new", status={"phase": "Converting", "sourceKey": "abc"})
    for users in ([other], [converting]):
        kept = collect_adapter_artifact(deleted(), users, None, now=NOW, config=CONFIG)
        assert kept.done and kept.create is None and "kept" in kept.message
    assert collect_adapter_artifact(adapter(name="new"), [], None, now=NOW, config=CONFIG).done  # never converted


def record(engine_hash: str = "h1", uri: str = "pvc://trtfleet-engines/h1", since: str | None = None) -> Obj:
    meta: Obj = {"name": "trtfleet-engine-h1", "namespace": "models", "uid": "u"}
    if since:
        meta["annotations"] = {"trtfleet.io/unused-since": since}
    return {"metadata": meta, "data": {"hash": engine_hash, "uri": uri}}


def test_engine_retention_marks_unmarks_and_collects() -> None:
    assert collect_engine(record(), {"h1"}, now=NOW, config=CONFIG).mark is None
    assert collect_engine(record(since="2026-11-21T11:00:00Z"), {"h1"}, now=NOW, config=CONFIG).clear
    assert collect_engine(record(), set(), now=NOW, config=CONFIG).mark == "2026-11-21T12:00:00Z"
    young = collect_engine(record(since="2026-11-21T11:30:00Z"), set(), now=NOW, config=CONFIG)
    assert not young.delete and young.create is None
    old = collect_engine(record(since="2026-11-21T10:00:00Z"), set(), now=NOW, config=CONFIG)
    assert old.delete and old.create is not None
    assert old.create["spec"]["template"]["spec"]["containers"][0]["args"] == ["--remove", "h1"]
    assert old.create["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 0  # NVIDIA's files
    staged = collect_engine(record(uri="pvc://trtfleet-engines/checkpoints/h1/quantized", since="2026-11-20T00:00:00Z"),
                            set(), now=NOW, config=CONFIG)
    assert staged.create is not None
    assert staged.create["spec"]["template"]["spec"]["containers"][0]["args"] == ["--remove", "checkpoints/h1"]
    off = replace(CONFIG, engine_retention_s=0)
    assert collect_engine(record(since="2026-01-01T00:00:00Z"), set(), now=NOW, config=off) == type(old)()


def test_used_hashes_come_from_status_deployments_and_jobs() -> None:
    annotated = [{"metadata": {"annotations": {"trtfleet.io/engine-hash": "d"}}}]
    assert used_hashes([{"status": {"engine": {"hash": "b"}}}, {}], annotated, []) == {"b", "d"}
