"""The operator's small pure pieces: names, conditions, Job/Pod reading, status patches, config, errors."""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from pathlib import Path

import kopf
import pytest
from trtfleet_operator import conditions as cond
from trtfleet_operator.artifacts import ArtifactSummary, SummaryError, parse_summary, summarize
from trtfleet_operator.cli import config_from_args, configure
from trtfleet_operator.config import BuildPolicy, Images
from trtfleet_operator.errors import (
    ConfigError,
    ConflictError,
    InvalidError,
    KubeError,
    KubeUnavailableError,
    kube_error,
)
from trtfleet_operator.handlers import kopf_error
from trtfleet_operator.jobs import convert as convert_job
from trtfleet_operator.kube import object_path
from trtfleet_operator.main import connection_info
from trtfleet_operator.names import dns_label, engine_hash_label, hash16, label_value
from trtfleet_operator.reconcile.types import failure_message, job_snapshot, status_patch, success_message

from tests.unit.operator.helpers import job_pod, job_status
from trtfleet.kube import KubeSource, load_connection


@pytest.mark.parametrize(
    ("name", "ok"),
    [("llama3-8b", True), ("Llama_3", False), ("3llama", False), ("x" * 63, True), ("x" * 64, False)],
)
def test_dns_label(name: str, ok: bool) -> None:
    out = dns_label(name)
    assert (out == name) is ok
    assert len(out) <= 63 and out[0].isalpha() and out == dns_label(name)


def test_label_values_and_hashes() -> None:
    full = "9b7bc2b52787f3bde86ae741e34ccf8a6a14ab6e0dabfdb5bf4aa116d8e10e30"
    assert engine_hash_label(full) == hash16(full) == full[:16]
    assert label_value("sql") == "sql"
    long = label_value("a" * 100)
    assert len(long) <= 63 and long == label_value("a" * 100) and long != label_value("a" * 101)


def test_condition_transition_time_moves_only_on_status_change() -> None:
    first = cond.merge(None, [cond.make("Ready", "False", "RollingOut", "x")], now="T1")
    same = cond.merge(first, [cond.make("Ready", "False", "ReplicasUnavailable", "y")], now="T2")
    flipped = cond.merge(same, [cond.make("Ready", "True", "RolloutComplete")], now="T3")
    assert [c["lastTransitionTime"] for c in (*first, *same, *flipped)] == ["T1", "T1", "T3"]
    ordered = cond.merge(None, [cond.make("Ready", "True", "A"), cond.make("EngineBuilt", "True", "B")], now="T")
    assert [c["type"] for c in ordered] == ["EngineBuilt", "Ready"]


def test_job_snapshot_reads_the_job_controller_status() -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "j",
            "namespace": "n",
            "labels": {"trtfleet.io/build-attempt": "3"},
            "annotations": {"trtfleet.io/engine-hash": "h"},
        },
    }
    running, done, failed = (job_snapshot(job_status(job, s)) for s in ("running", "complete", "failed"))
    assert (running.finished, running.active, running.attempt, running.engine_hash) == (False, 1, 3, "h")
    assert done.complete and not done.failed_final and done.finished_at == "2026-11-21T11:00:00Z"
    assert failed.failed_final and failed.failure_reason == "BackoffLimitExceeded"


def test_termination_messages() -> None:
    job = job_status(
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}},
        "failed",
        message="Job has reached the specified backoff limit",
    )
    old = job_pod(job, "build", exit_code=1, message="first", finished_at="2026-11-21T10:00:00Z")
    new = job_pod(job, "build", exit_code=137, finished_at="2026-11-21T11:00:00Z")
    new["metadata"]["name"] = "j-second"
    snapshot = job_snapshot(job)
    assert failure_message(snapshot, [old, new], "build") == "pod j-second: exited with code 137 (Error)"
    assert failure_message(snapshot, [], "build").startswith("BackoffLimitExceeded: Job has reached")
    assert success_message([job_pod(job, "convert", exit_code=0, message=" {} \n")], "convert") == "{}"


def test_status_patch_sets_changes_and_nulls_removals_only_for_owned_keys() -> None:
    old = {"phase": "Ready", "taskId": 3, "nextTaskId": 9, "artifact": {"rank": 4}}
    new = {"phase": "Ready", "artifact": {"rank": 8}}
    assert status_patch(old, new, ("phase", "taskId", "artifact")) == {"taskId": None, "artifact": {"rank": 8}}
    assert status_patch(old, old, ("phase", "taskId")) == {}


def test_summary_round_trip_and_errors() -> None:
    manifest = {
        "rank": 8,
        "modules": ["attn_v", "attn_q"],
        "weights_bytes": 10,
        "dtype": "float16",
        "outputs": {"model.lora_weights.npy": {"sha256": "ab", "size_bytes": 10}},
    }
    summary = summarize(manifest)
    assert parse_summary(summary.to_json()) == summary == ArtifactSummary(8, ("attn_q", "attn_v"), "ab", 10, "float16")
    assert len(summary.to_json()) < 4096
    for bad in ("", "not json", '{"format": "other"}', '{"format": "trtfleet.convert-summary/v1", "rank": 0}'):
        with pytest.raises(SummaryError):
            parse_summary(bad)


def test_build_retry_delay_doubles_and_is_capped() -> None:
    policy = BuildPolicy(retry_base_s=60, retry_max_s=300)
    assert [policy.retry_delay_s(a) for a in (1, 2, 3, 4)] == [60, 120, 240, 300]


def test_images_from_the_environment_and_the_removed_runtime_image_refused() -> None:
    images = Images.from_env({"TRTFLEET_WORKER_IMAGE": "w:1", "TRTFLEET_MODELOPT_IMAGE": "m:1"})
    assert (images.worker, images.modelopt) == ("w:1", "m:1")
    assert Images.from_env({}).modelopt is None
    with pytest.raises(ConfigError, match="TRTFLEET_RUNTIME_IMAGE no longer exist"):
        Images.from_env({"TRTFLEET_RUNTIME_IMAGE": "ghcr.io/trtfleet/trtllm-runtime:1"})


def test_cli_flags() -> None:
    parser = argparse.ArgumentParser()
    configure(parser)
    args = parser.parse_args(
        [
            "--namespace",
            "a",
            "-n",
            "b",
            "--engine-pvc",
            "e",
            "--build-retry-delay",
            "5",
            "--convert-node-selector",
            "pool=cpu",
        ]
    )
    config = config_from_args(args)
    assert args.namespace == ["a", "b"] and config.storage.engine_pvc == "e"
    assert config.build.retry_base_s == 5 and config.convert_node_selector == (("pool", "cpu"),)
    with pytest.raises(SystemExit):
        parser.parse_args(["--namespace", "a", "--all-namespaces"])


@pytest.mark.parametrize(
    ("error", "kind", "delay"),
    [
        (ConflictError(409, "Conflict", "x"), kopf.TemporaryError, 1.0),
        (KubeUnavailableError(0, "Unavailable", "x"), kopf.TemporaryError, 10.0),
        (kube_error(503, "ServiceUnavailable", "x"), kopf.TemporaryError, 10.0),
        (InvalidError(422, "Invalid", "x"), kopf.PermanentError, None),
        (KubeError(403, "Forbidden", "x"), kopf.PermanentError, None),
    ],
)
def test_errors_map_to_kopf_retries_in_one_place(error: KubeError, kind: type, delay: float | None) -> None:
    mapped = kopf_error(error)
    assert isinstance(mapped, kind)
    if delay is not None:
        assert isinstance(mapped, kopf.TemporaryError) and mapped.delay == delay


def test_kopf_logs_in_with_what_the_shared_layer_loaded(tmp_path: Path) -> None:
    server = "https://10.0.0.1:6443"
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        json.dumps(
            {
                "current-context": "c",
                "clusters": [{"name": "k", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
                "users": [{"name": "u", "user": {"token": "t0k"}}],
                "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u", "namespace": "ns"}}],
            }
        )
    )
    connection = asyncio.run(load_connection(KubeSource(kubeconfig=str(kubeconfig), environ={})))
    info = asyncio.run(connection_info(connection))
    assert (info.server, info.scheme, info.token, info.insecure, info.default_namespace) == (
        "https://10.0.0.1:6443", "Bearer", "t0k", True, "ns"
    )


def test_object_paths() -> None:
    assert object_path("batch/v1", "Job", "ns", "j") == "/apis/batch/v1/namespaces/ns/jobs/j"
    assert object_path("v1", "Pod", "ns", "p") == "/api/v1/namespaces/ns/pods/p"


def test_convert_job_entrypoint_reports_a_missing_source(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    code = convert_job.main(
        [
            "--source-uri",
            f"file://{tmp_path}/missing",
            "--out",
            str(tmp_path / "out"),
            "--dtype",
            "float16",
            "--termination-log",
            str(log),
            "--trtfleet",
            str(Path(sys.executable).parent / "trtfleet"),
        ]
    )
    assert code == 1
    assert log.read_text().startswith(f"trtfleet lora convert file://{tmp_path}/missing failed")


def test_convert_job_entrypoint_converts_a_sample_adapter(tmp_path: Path) -> None:
    from trtfleet_engines.reference.numpy_llama import SAMPLE_ADAPTERS_DIR

    samples = sorted(p for p in Path(SAMPLE_ADAPTERS_DIR).glob("*") if (p / "adapter_config.json").is_file())
    assert samples, "the committed sample adapters are missing (hack/gen_reference_assets.py makes them)"
    log = tmp_path / "termination-log"
    argv = [
        sys.executable,
        "-m",
        "trtfleet_operator.jobs.convert",
        "--source-uri",
        f"file://{samples[0]}",
        "--out",
        str(tmp_path / "out"),
        "--dtype",
        "float16",
        "--termination-log",
        str(log),
        "--trtfleet",
        str(Path(sys.executable).parent / "trtfleet"),
    ]
    subprocess.run(argv, check=True, capture_output=True, text=True)
    summary = parse_summary(log.read_text())
    assert summary.rank >= 1 and summary.modules and summary.dtype == "float16"
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert summary.sha256 == manifest["outputs"]["model.lora_weights.npy"]["sha256"]
