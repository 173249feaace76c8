"""The pytorch-mode reference server's pure pieces: admission gate, settings, request bodies, adapter store."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic import ValidationError
from trtfleet_engines.reference.errors import ExecutorRequestFailed
from trtfleet_engines.reference.kv_blocks import KvCacheSettings
from trtfleet_engines.reference.numpy_llama import SAMPLE_ADAPTERS_DIR, TINY_LLAMA_DIR, LlamaConfig
from trtfleet_engines.reference.serve.adapters import (
    AdapterGate,
    AdapterLoadError,
    PeftAdapterStore,
    PeftLoraInputs,
    TierSizes,
)
from trtfleet_engines.reference.serve.protocol import ChatCompletionRequest, CompletionRequest
from trtfleet_engines.reference.serve.settings import SettingsError, settings_from_args
from trtfleet_engines.reference.waiting_queue import WaitingQueuePolicy

from trtfleet.api.basemodel import DEFAULT_TARGET_MODULES


def test_gate_admits_up_to_capacity_distinct_adapters_and_shares_one() -> None:
    async def scenario() -> list[str]:
        gate = AdapterGate(2)
        events: list[str] = []
        await gate.acquire(1)
        await gate.acquire(2)
        await gate.acquire(1)  # an adapter already in flight never waits

        async def third() -> None:
            await gate.acquire(3)
            events.append("3 admitted")

        task = asyncio.create_task(third())
        await asyncio.sleep(0)
        events.append(f"waiting with {sorted(gate.in_flight())}")
        gate.release(1)  # 1 still has a user: nothing frees
        await asyncio.sleep(0)
        gate.release(1)
        await task
        events.append(f"now {sorted(gate.in_flight())}")
        return events

    assert asyncio.run(scenario()) == ["waiting with [1, 2]", "3 admitted", "now [2, 3]"]


def test_settings_from_options_file_with_flag_overrides(tmp_path: Path) -> None:
    options = tmp_path / "options.yaml"
    options.write_text(
        "max_batch_size: 4\nmax_seq_len: 200\nreturn_perf_metrics: false\n"
        "lora_config: {max_loras: 3, max_cpu_loras: 6, max_lora_rank: 8, lora_target_modules: [attn_q, attn_v]}\n"
        "peft_cache_config: {optimal_adapter_size: 8, max_adapter_size: 8}\n"
    )
    settings = settings_from_args(["--config", str(options), "--max-cpu-loras", "9", "--max_batch_size", "2"])
    assert (settings.max_batch_size, settings.max_seq_len, settings.return_perf_metrics) == (2, 200, False)
    assert settings.lora is not None
    assert (settings.lora.max_loras, settings.lora.max_cpu_loras, settings.lora.max_adapter_size) == (3, 9, 8)
    assert [m.value for m in settings.lora.target_modules] == ["attn_q", "attn_v"]
    assert settings.served_model_name == "tiny-llama" and settings.host == "localhost"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        pytest.param("- a list\n", "mapping", id="not-a-mapping"),
        pytest.param("lora_config: {lora_target_modules: [q_proj]}\n", "lora_target_modules", id="hf-module-name"),
        pytest.param("max_batch_size: 0\n", "max_batch_size", id="zero"),
    ],
)
def test_bad_options_files_are_refused(tmp_path: Path, text: str, needle: str) -> None:
    options = tmp_path / "options.yaml"
    options.write_text(text)
    with pytest.raises(SettingsError, match=needle):
        settings_from_args(["--config", str(options)])


@pytest.mark.parametrize(
    ("text", "flags", "expected"),
    [
        pytest.param("", [], KvCacheSettings(8, 32, True, 0), id="upstream-defaults"),
        pytest.param("kv_cache_config: {enable_block_reuse: false, free_gpu_memory_fraction: 0.9, dtype: auto}\n",
                     [], KvCacheSettings(8, 32, False, 0), id="rendered-keys"),
        pytest.param("kv_cache_config: {tokens_per_block: 16, max_tokens: 100, event_buffer_max_size: 50}\n",
                     [], KvCacheSettings(7, 16, True, 50), id="reference-keys"),
        pytest.param("kv_cache_config: {tokens_per_block: 16}\n",
                     ["--kv-tokens-per-block", "8", "--kv-max-tokens", "64", "--kv-block-reuse", "false",
                      "--kv-event-buffer-max-size", "3"], KvCacheSettings(8, 8, False, 3), id="flags-win"),
    ],
)
def test_kv_cache_config(tmp_path: Path, text: str, flags: list[str], expected: KvCacheSettings) -> None:
    options = tmp_path / "options.yaml"
    options.write_text("max_batch_size: 1\nmax_seq_len: 256\n" + text)
    assert settings_from_args(["--config", str(options), *flags]).kv_cache == expected


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        pytest.param("kv_cache_config: {tokens_per_block: 0}\n", "tokens_per_block", id="zero-block"),
        pytest.param("kv_cache_config: {enable_block_reuse: maybe}\n", "enable_block_reuse", id="not-bool"),
        pytest.param("kv_cache_config: {event_buffer_max_size: -1}\n", "event_buffer_max_size", id="negative"),
        pytest.param("kv_cache_config: [1]\n", "kv_cache_config", id="not-a-mapping"),
    ],
)
def test_bad_kv_cache_config_is_refused(tmp_path: Path, text: str, needle: str) -> None:
    options = tmp_path / "options.yaml"
    options.write_text(text)
    with pytest.raises(SettingsError, match=needle):
        settings_from_args(["--config", str(options)])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("{}", WaitingQueuePolicy.FCFS, id="default"),
        pytest.param("scheduler_config: {waiting_queue_policy: priority}", WaitingQueuePolicy.PRIORITY, id="priority"),
        pytest.param("scheduler_config: {waiting_queue_policy: fcfs}", WaitingQueuePolicy.FCFS, id="fcfs"),
    ],
)
def test_scheduler_config_waiting_queue_policy(tmp_path: Path, text: str, expected: WaitingQueuePolicy) -> None:
    options = tmp_path / "options.yaml"
    options.write_text(text)
    assert settings_from_args(["--config", str(options)]).waiting_policy is expected


def test_an_unknown_waiting_queue_policy_is_refused(tmp_path: Path) -> None:
    options = tmp_path / "options.yaml"
    options.write_text("scheduler_config: {waiting_queue_policy: lottery}")
    with pytest.raises(SettingsError, match="waiting_queue_policy must be fcfs or priority"):
        settings_from_args(["--config", str(options)])


def test_no_lora_config_means_no_lora() -> None:
    assert settings_from_args([]).lora is None


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        pytest.param({"model": "m", "prompt": "p", "cache_salt": "s"}, "cache_salt", id="completions-no-salt"),
        pytest.param({"model": "m", "prompt": "p", "lora_request": {"lora_name": "a", "lora_int_id": 1}},
                     "lora_path () does not exist.", id="path-required"),
        pytest.param({"model": "m", "prompt": "p", "stream_options": {}}, "stream", id="options-need-stream"),
    ],
)
def test_completion_body_validation(body: dict[str, object], needle: str) -> None:
    with pytest.raises(ValidationError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        CompletionRequest.model_validate(body)


def test_chat_prompt_is_the_last_user_message() -> None:
    body = ChatCompletionRequest.model_validate({"model": "m", "messages": [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"}, {"role": "user", "content": [{"type": "text", "text": "second"}]},
    ]})
    assert body.prompt_text() == "second"


@pytest.fixture(scope="module")
def config() -> LlamaConfig:
    return LlamaConfig.from_hf_config(TINY_LLAMA_DIR)


def _store(config: LlamaConfig, max_loras: int, max_cpu_loras: int) -> PeftAdapterStore:
    return PeftAdapterStore(config, TierSizes(max_loras, max_cpu_loras, 8, DEFAULT_TARGET_MODULES, 8, 8))


def _lora(store: PeftAdapterStore, task_id: int, name: str) -> PeftLoraInputs:
    path = str(SAMPLE_ADAPTERS_DIR / name)
    return PeftLoraInputs(task_id=task_id, name=name, path=path, loaded=store.load(path))


def test_store_evicts_idle_adapters_lru_and_never_busy_ones(config: LlamaConfig) -> None:
    store = _store(config, 1, 1)  # host: 2 pages = two rank-8 adapters; device: 2 pages
    assert store.host_adapters == 2
    store.admit(1, _lora(store, 11, "upper"))
    store.admit(2, _lora(store, 12, "reverse"))
    assert store.ensure_device(11) and store.ensure_device(12)
    with pytest.raises(ExecutorRequestFailed, match="Cache is full"):
        store.admit(3, _lora(store, 13, "json"))  # both busy: the gate keeps this from happening in the server
    store.release(11)
    store.admit(4, _lora(store, 13, "json"))  # 11 is idle: evicted
    assert store.snapshot()["hostEvictions"] == [11]
    assert store.snapshot()["loads"] == [11, 12, 13]


def test_device_pages_make_a_request_wait_not_fail(config: LlamaConfig) -> None:
    store = _store(config, 1, 4)
    for request_id, (task_id, name) in enumerate([(1, "upper"), (2, "reverse"), (3, "json")]):
        store.admit(request_id, _lora(store, task_id, name))
    assert store.ensure_device(1) and store.ensure_device(2)
    assert not store.ensure_device(3)
    store.release(1)
    assert store.ensure_device(3)
    snapshot = store.snapshot()
    assert (snapshot["deviceWaits"], snapshot["deviceEvictions"], snapshot["peakDeviceInUse"]) == (1, [1], 2)


def test_a_directory_that_is_not_an_adapter_does_not_load(config: LlamaConfig, tmp_path: Path) -> None:
    with pytest.raises(AdapterLoadError):
        _store(config, 1, 1).load(str(tmp_path))


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        pytest.param(["/nonexistent-model-dir"], "cannot load the model", id="bad-model-dir"),
        pytest.param(["--max-loras", "0"], "max_loras must be a positive integer", id="zero-loras"),
    ],
)
def test_cli_refuses_to_start_with_a_clear_error(argv: list[str], needle: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from trtfleet_engines.reference.serve.__main__ import main

    assert main(argv) == 2
    assert needle in capsys.readouterr().err


GOLDEN_DIR = Path(__file__).resolve().parents[2] / "golden/pytorch"
GOLDEN_OPTIONS = sorted(GOLDEN_DIR.glob("*/expected/llm-api-options.yaml"))


@pytest.mark.parametrize("options", GOLDEN_OPTIONS, ids=lambda path: path.parent.parent.name)
def test_every_rendered_options_file_starts_the_reference_server(options: Path) -> None:
    import yaml

    rendered = yaml.safe_load(options.read_text())
    settings = settings_from_args(["--config", str(options)])
    assert (settings.max_batch_size, settings.max_seq_len) == (rendered["max_batch_size"], rendered["max_seq_len"])
    lora = rendered.get("lora_config")
    if lora is None:
        assert settings.lora is None
    else:
        assert settings.lora is not None
        assert (settings.lora.max_loras, settings.lora.max_cpu_loras) == (lora["max_loras"], lora["max_cpu_loras"])
    speculative = rendered.get("speculative_config")
    if speculative is not None and speculative["decoding_type"] == "NGram":
        assert settings.speculation is not None
        assert settings.speculation.max_draft_len == speculative["max_draft_len"]
    elif speculative is not None:  # modes the reference engine does not draft with: served without speculation
        assert settings.speculation is None


def test_golden_options_files_exist() -> None:
    assert len(GOLDEN_OPTIONS) >= 5


def test_a_pretend_volume_makes_reading_an_adapter_last_its_bytes_over_the_bandwidth(config: LlamaConfig) -> None:
    """Lower bound only (it holds however slow the machine is); the copies to the device tier are counted."""
    import time

    path = str(SAMPLE_ADAPTERS_DIR / "upper")
    store = PeftAdapterStore(config, TierSizes(1, 1, 8, DEFAULT_TARGET_MODULES, 8, 8), read_bytes_per_s=1e6)
    started = time.monotonic()
    loaded = store.load(path)
    elapsed = time.monotonic() - started
    store.admit(1, PeftLoraInputs(task_id=5, name="upper", path=path, loaded=loaded))
    assert store.ensure_device(5)
    assert store.copied_bytes_total == loaded.pages * store.geometry.page_bytes
    assert loaded.nbytes > 0
    assert elapsed >= loaded.nbytes / 1e6
