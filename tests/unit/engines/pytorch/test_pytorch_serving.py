"""trtllm-serve argv, probes and the prepare plan; prepare_hash covers only what changes the checkpoint."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from trtfleet_engines.errors import UnsupportedError
from trtfleet_engines.pytorch.serving import plan_prepare, prepare_hash, probes, serve_argv

from trtfleet.api.basemodel import BaseModelSpec


def test_argv_binds_all_interfaces_and_passes_the_options_file() -> None:
    argv = serve_argv(checkpoint_dir="/m/ckpt", options_path="/etc/o.yaml", served_model_name="llama")
    assert argv[:2] == ("trtllm-serve", "/m/ckpt")
    flags = dict(zip(argv[2::2], argv[3::2], strict=True))
    assert flags == {"--backend": "pytorch", "--host": "0.0.0.0", "--port": "8000", "--config": "/etc/o.yaml",
                     "--served_model_name": "llama"}


def test_argv_without_a_served_name_leaves_the_flag_out() -> None:
    argv = serve_argv(checkpoint_dir="/m/ckpt", options_path="/etc/o.yaml", served_model_name=None)
    assert "--served_model_name" not in argv and argv[-2:] == ("--config", "/etc/o.yaml")


def test_probes_hit_health() -> None:
    found = probes()
    for probe in (found.startup, found.readiness, found.liveness):
        assert probe.to_kubernetes()["httpGet"] == {"path": "/health", "port": 8000}
    assert found.startup.period_s * found.startup.failure_threshold >= 1800


@pytest.mark.parametrize(
    "patch",
    [
        pytest.param({"parallelism": {"tensor": 2}, "engine": {"gpu": {"count": 2}}}, id="parallelism"),
        pytest.param({"engine": {"maxBatchSize": 3, "maxNumTokens": 99}}, id="limits"),
        pytest.param({"lora": {"maxRank": 8, "enabled": False}}, id="lora"),
        pytest.param({"serving": {"replicas": 7, "kvCacheFreeGpuMemFraction": 0.5}}, id="serving"),
        pytest.param({"dtype": "bfloat16"}, id="dtype-unquantized"),
        pytest.param({"engine": {"image": "other:1"}}, id="image-unquantized"),
    ],
)
def test_hash_ignores_what_does_not_change_the_checkpoint(
    make_spec: Callable[..., BaseModelSpec], patch: dict[str, Any]
) -> None:
    assert prepare_hash(make_spec(patch)) == prepare_hash(make_spec())


@pytest.mark.parametrize(
    "patch",
    [
        pytest.param({"source": {"revision": "def456"}}, id="revision"),
        pytest.param({"source": {"uri": "hf://meta-llama/Llama-3.1-8B-Instruct"}}, id="uri"),
        pytest.param({"quantization": {"mode": "fp8"}}, id="quantized"),
    ],
)
def test_hash_follows_what_changes_the_checkpoint(
    make_spec: Callable[..., BaseModelSpec], patch: dict[str, Any]
) -> None:
    assert prepare_hash(make_spec(patch)) != prepare_hash(make_spec())


def test_quantized_hash_follows_kv_format_and_image(make_spec: Callable[..., BaseModelSpec]) -> None:
    fp8 = {"quantization": {"mode": "fp8"}}
    base = prepare_hash(make_spec(fp8))
    assert prepare_hash(make_spec({"quantization": {"mode": "fp8", "kvCacheDtype": "fp8"}})) != base
    assert prepare_hash(make_spec({**fp8, "engine": {"image": "other:1"}})) != base


def test_prepare_plan_stages_then_quantizes(make_spec: Callable[..., BaseModelSpec]) -> None:
    plain = plan_prepare(make_spec(), cache_root="/cache/")
    assert plain.quantize is None
    assert plain.serve_checkpoint_dir == f"/cache/checkpoints/{plain.content_hash}/original"
    awq = plan_prepare(make_spec({"quantization": {"mode": "int4_awq"}}), cache_root="/cache")
    assert awq.quantize is not None
    argv = awq.quantize.argv
    flags = dict(zip(argv[2::2], argv[3::2], strict=True))
    assert flags == {"--pyt_ckpt_path": awq.stage.destination_dir, "--qformat": "int4_awq",
                     "--kv_cache_qformat": "none", "--export_path": awq.serve_checkpoint_dir}


def test_int4_weight_only_has_no_hf_export(make_spec: Callable[..., BaseModelSpec]) -> None:
    with pytest.raises(UnsupportedError, match="int4_awq"):
        plan_prepare(make_spec({"quantization": {"mode": "int4_weight_only"}}), cache_root="/cache")
