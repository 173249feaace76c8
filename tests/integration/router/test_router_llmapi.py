"""A ``pytorch`` fleet served by Triton with the llmapi model: real tritonserver workers running the reference
``tensorrt_llm`` llmapi model, the official tritonclient against a worker and the openai client through the
router.

Each worker's tiers: one adapter on the device, two on the host (``--max-loras 1 --max-cpu-loras 2``); adapters
are read by the worker from ``lora_path`` (the sample PEFT directories). Expected greedy outputs are the fixture
the Triton reference engine and the trtllm-serve reference are tested against.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import yaml
from trtfleet_engines.reference.llmapi.repository import build_llmapi_repository
from trtfleet_engines.reference.llmapi.runtime import settings_for
from trtfleet_engines.reference.numpy_llama import SAMPLE_ADAPTERS_DIR
from trtfleet_engines.reference.repository import default_reference_spec
from trtfleet_engines.reference.serve.app import ServeApp
from trtfleet_engines.reference.server import WorkerProcess, start_worker

from tests.integration.router.sample_fleet import (
    ADAPTERS,
    MAX_TOKENS,
    OUTPUTS,
    PROMPTS,
    TASK_IDS,
    check_each_prompts_output,
    check_more_adapters_than_a_tier,
    check_triton_endpoints_refused,
    openai_client,
    pytorch_fleet_config,
    start_router,
)
from tests.unit.router.harness import RouterThread

pytestmark = pytest.mark.integration

SERVE_ARGS = ["--max-loras", "1", "--max-cpu-loras", "2"]
TIMEOUT_S = 60.0


@dataclass
class LlmapiFleet:
    workers: list[WorkerProcess]
    router: RouterThread
    repository: Path


def tier_pages(repository: Path) -> dict[str, Any]:
    """The worker's tiers in pages, as ``status.capacity`` would carry them (the same settings, built here)."""
    model_yaml = repository / "tensorrt_llm" / "1" / "model.yaml"
    model = yaml.safe_load(model_yaml.read_text())["model"]
    store = ServeApp(settings_for(str(model_yaml), model, SERVE_ARGS)).store
    assert store is not None
    return store.snapshot()


def fleet_config(workers: list[WorkerProcess], repository: Path) -> dict[str, Any]:
    backends = [{"address": f"127.0.0.1:{w.grpc_port}", "http": f"127.0.0.1:{w.http_port}", "podId": f"w{i}"}
                for i, w in enumerate(workers)]
    return pytorch_fleet_config(backends, tier_pages(repository), server="triton")


@pytest.fixture(scope="module")
def llmapi_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlmapiFleet]:
    repository = build_llmapi_repository(tmp_path_factory.mktemp("llmapi-repo"), default_reference_spec(),
                                         serve_args=SERVE_ARGS)
    with ExitStack() as stack:
        workers = []
        for _ in range(2):
            worker = start_worker(repository)
            stack.callback(worker.stop)
            workers.append(worker)
        router = start_router(stack, fleet_config(workers, repository))
        yield LlmapiFleet(workers, router, repository)


def _input(name: str, value: Any, datatype: str) -> grpcclient.InferInput:
    array = np.asarray(value)
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def llmapi_inputs(prompt: str, *, adapter: str | None, streaming: bool, exclude: bool) -> list[grpcclient.InferInput]:
    inputs = [
        _input("text_input", np.array([prompt.encode()], dtype=np.object_), "BYTES"),
        _input("streaming", np.array([streaming]), "BOOL"),
        _input("sampling_param_max_tokens", np.array([MAX_TOKENS], np.int32), "INT32"),
        _input("sampling_param_temperature", np.array([0.0], np.float32), "FP32"),
        _input("sampling_param_exclude_input_from_output", np.array([exclude]), "BOOL"),
        _input("return_finish_reason", np.array([True]), "BOOL"),
    ]
    if adapter is not None:
        inputs += [
            _input("lora_id", np.array([TASK_IDS[adapter]], np.uint64), "UINT64"),
            _input("lora_name", np.array([adapter.encode()], dtype=np.object_), "BYTES"),
            _input("lora_path", np.array([str(SAMPLE_ADAPTERS_DIR / adapter).encode()], dtype=np.object_), "BYTES"),
        ]
    return inputs


def ask_worker(worker: WorkerProcess, inputs: list[grpcclient.InferInput]) -> tuple[list[str], str | None, str]:
    """(every text_output in order, the final finish_reason, the error text or "") of one streamed request."""
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{worker.grpc_port}")
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("tensorrt_llm", inputs, request_id="t")
        texts: list[str] = []
        while True:
            result, error = answers.get(timeout=TIMEOUT_S)
            if error is not None:
                return texts, None, str(error)
            texts.append(result.as_numpy("text_output")[0].decode())
            if result.get_response().parameters["triton_final_response"].bool_param:
                return texts, result.as_numpy("finish_reason")[0].decode(), ""
    finally:
        client.stop_stream()
        client.close()


@pytest.mark.parametrize("name", ["base", *ADAPTERS])
def test_tritonclient_gets_each_adapters_outputs_from_a_worker(llmapi_fleet: LlmapiFleet, name: str) -> None:
    worker = llmapi_fleet.workers[0]
    adapter = None if name == "base" else name
    for prompt, want in list(zip(PROMPTS, OUTPUTS[name], strict=True))[:3]:
        texts, reason, error = ask_worker(worker, llmapi_inputs(prompt, adapter=adapter, streaming=False, exclude=True))
        assert (texts, reason, error) == ([want], reason, "") and reason in ("stop", "length")
        texts, _, _ = ask_worker(worker, llmapi_inputs(prompt, adapter=adapter, streaming=True, exclude=True))
        assert texts[-1] == want and all(want.startswith(t) for t in texts), "each answer is the text so far"
        texts, _, _ = ask_worker(worker, llmapi_inputs(prompt, adapter=adapter, streaming=False, exclude=False))
        assert texts == [prompt + want], "upstream's default keeps the prompt in text_output"


def test_a_lora_path_the_worker_cannot_see_is_refused_with_upstreams_text(llmapi_fleet: LlmapiFleet) -> None:
    inputs = llmapi_inputs("hello", adapter=None, streaming=False, exclude=True) + [
        _input("lora_id", np.array([99], np.uint64), "UINT64"),
        _input("lora_name", np.array([b"ghost"], dtype=np.object_), "BYTES"),
        _input("lora_path", np.array([b"/nowhere/ghost"], dtype=np.object_), "BYTES"),
    ]
    _, _, error = ask_worker(llmapi_fleet.workers[0], inputs)
    assert "lora_path does not exist on the Triton server's filesystem: /nowhere/ghost" in error


@pytest.mark.parametrize("name", ["base", *ADAPTERS])
def test_openai_client_through_the_router_gets_each_adapters_outputs(llmapi_fleet: LlmapiFleet, name: str) -> None:
    check_each_prompts_output(openai_client(llmapi_fleet.router), name, usage=False)


def test_more_adapters_than_a_tier_holds_wait_or_spread_never_fail(llmapi_fleet: LlmapiFleet) -> None:
    check_more_adapters_than_a_tier(llmapi_fleet.router, rounds=2, threads=6)


def test_triton_endpoints_of_the_router_say_to_use_the_openai_api(llmapi_fleet: LlmapiFleet) -> None:
    check_triton_endpoints_refused(llmapi_fleet.router)
