"""The reference worker end to end: a real tritonserver serving the tiny model with TRT-LLM's tensors.

One worker (host LoRA tier of 3 sample adapters, 4 ms pretend step time) is shared by the module.
Every test uses fresh LoRA task ids and leaves no request running.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from trtfleet_engines.reference.repository import lora_cache_bytes_for
from trtfleet_engines.reference.server import WorkerProcess
from trtfleet_engines.reference.tokenizer import ByteTokenizer, prompt_ids
from trtfleet_engines.reference.workers import running_worker

from tests.integration.reference.tiny import new_task_id, sample_adapters
from tests.integration.reference.triton_client import (
    NEVER_END_ID,
    Adapter,
    Result,
    Stream,
    generate,
    request_inputs,
    wait_until,
)

pytestmark = pytest.mark.integration

STARTUP_TARGET_S = 15.0
HOST_ADAPTERS = 3
MIN_STEP_MS = 4.0
"""Pretend GPU step time of the shared worker, so long requests stay in flight long enough to act on."""
LONG_TOKENS = 240
"""Output length of a long request: 240 steps of >= 4 ms keep it in flight for ~1 s."""
MISS_RE = (
    r"Executor failed process requestId \d+ due to the following error: "
    r"LoRA task {task} not found in cache\. Please send LoRA weights with request"
)
TOKENIZER = ByteTokenizer()
EXPECTED_OUTPUTS = Path(__file__).resolve().parents[2] / "fixtures" / "lora" / "expected_outputs.json"
"""Greedy outputs of the real transformers + PEFT models (written by hack/gen_reference_assets.py)."""


@pytest.fixture(scope="module")
def worker() -> Iterator[WorkerProcess]:
    with running_worker(lora_cache_host_bytes=lora_cache_bytes_for(HOST_ADAPTERS), min_step_ms=MIN_STEP_MS) as w:
        print(f"reference worker ready in {w.startup_s:.2f} s (http {w.http_port}, grpc {w.grpc_port})")
        yield w
        tail = w.log_tail(2000)
    assert not w.running(), "tritonserver still running after the fixture"
    assert w.process.returncode == 0, "tritonserver did not unload every model within its exit timeout"
    assert w.stubs_reaped == 0, "python backend stubs outlived tritonserver"
    assert not any(path.exists() for path in [w.repo_dir, w.log_path]), "temporary files left behind"
    print(tail)


@pytest.fixture(scope="module")
def adapters() -> dict[str, Adapter]:
    return sample_adapters()


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30) as client:  # one client: a new one per call costs ~100 ms of TLS setup
        yield client


def _idle(worker: WorkerProcess, http: httpx.Client) -> bool:
    text = http.get(worker.metrics_url).text
    return all(
        f'nv_trt_llm_request_metrics{{model="tensorrt_llm",request_type="{kind}",version="1"}} 0' in text
        for kind in ("active", "waiting")
    )


def _text(result: Result) -> str:
    assert result.error is None, result.error
    return TOKENIZER.decode(result.tokens)


def test_startup_is_fast(worker: WorkerProcess) -> None:
    print(f"startup-to-ready: {worker.startup_s:.2f} s")
    assert worker.startup_s < STARTUP_TARGET_S


def test_streaming_and_unary_give_the_same_tokens(worker: WorkerProcess) -> None:
    prompt = prompt_ids("hello world")
    unary = generate(worker.grpc_url, prompt, 40)
    streamed = generate(worker.grpc_url, prompt, 40, streaming=True)
    assert unary.responses == 1
    # One response per token, then an empty final one: the token that ended it (end_id) is not output.
    assert streamed.responses == len(streamed.tokens) + 1
    assert streamed.tokens == unary.tokens
    assert _text(unary) == "hello world"  # the base model echoes; end_id is never part of the output


def test_http_generate_on_ensemble_and_bls(worker: WorkerProcess, http: httpx.Client) -> None:
    expected = _text(generate(worker.grpc_url, prompt_ids("kubernetes operator"), 32))
    base = f"http://{worker.http_url}/v2/models"
    for model in ("ensemble", "tensorrt_llm_bls"):
        body = {"text_input": "kubernetes operator", "max_tokens": 32}
        reply = http.post(f"{base}/{model}/generate", json=body)
        assert reply.status_code == 200, reply.text
        assert reply.json()["text_output"] == expected
        with http.stream("POST", f"{base}/{model}/generate_stream", json={**body, "stream": True}) as s:
            events = [line.removeprefix("data: ") for line in s.iter_lines() if line.startswith("data: ")]
        deltas = [httpx.Response(200, content=e).json()["text_output"] for e in events]
        assert len(deltas) > 1 and "".join(deltas) == expected


def test_concurrent_batch_over_three_adapters_and_base_matches_each_alone(
    worker: WorkerProcess, adapters: dict[str, Adapter]
) -> None:
    """Every request gives the real transformers/PEFT model's greedy output, alone and in mixed batches."""
    expected = json.loads(EXPECTED_OUTPUTS.read_text())
    ids = {name: new_task_id() for name in adapters}
    jobs = [(name, prompt) for name in [*adapters, "base"] for prompt in expected["prompts"]]

    def run(name: str, prompt: str, with_weights: bool) -> Result:
        task_id = ids.get(name)
        adapter = adapters[name] if with_weights and name in adapters else None
        return generate(
            worker.grpc_url, prompt_ids(prompt), expected["max_new_tokens"], task_id=task_id, adapter=adapter
        )

    alone = {job: run(*job, with_weights=True) for job in jobs}
    for (name, prompt), result in alone.items():
        index = expected["prompts"].index(prompt)
        assert result.error is None and result.tokens == expected["models"][name]["output_ids"][index], (name, prompt)
    together: dict[tuple[str, str], Result] = {}
    threads = [
        threading.Thread(target=lambda job=job: together.__setitem__(job, run(*job, with_weights=False)))
        for job in jobs
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {job: r.tokens for job, r in together.items()} == {job: r.tokens for job, r in alone.items()}
    assert _text(alone[("upper", "hello world")]) == "HELLO WORLD"
    assert _text(alone[("reverse", "hello world")]) == "dlrow olleh"
    assert _text(alone[("json", "hello world")]) == '{"echo": "hello world"}'


def test_miss_then_weights_then_id_alone(
    worker: WorkerProcess, adapters: dict[str, Adapter], http: httpx.Client
) -> None:
    task = new_task_id()
    prompt = prompt_ids("abc")
    miss = generate(worker.grpc_url, prompt, 16, task_id=task)
    assert miss.error is not None and re.fullmatch(MISS_RE.format(task=task), miss.error), miss.error
    assert _text(generate(worker.grpc_url, prompt, 16, task_id=task, adapter=adapters["upper"])) == "ABC"
    assert _text(generate(worker.grpc_url, prompt, 16, task_id=task)) == "ABC"
    http_miss = http.post(
        f"http://{worker.http_url}/v2/models/tensorrt_llm_bls/generate",
        json={"text_input": "abc", "max_tokens": 8, "lora_task_id": new_task_id()},
    )
    # Triton 2.51's generate endpoint answers inference errors with 400 (newer Triton: 500 for INTERNAL).
    assert http_miss.status_code in (400, 500)
    assert re.search(r"LoRA task \d+ not found in cache", http_miss.json()["error"])


def test_eviction_is_lru_among_idle_adapters(worker: WorkerProcess, adapters: dict[str, Adapter]) -> None:
    a, b, c, d = (new_task_id() for _ in range(4))
    prompt = prompt_ids("abc")
    for task in (a, b, c):
        assert generate(worker.grpc_url, prompt, 8, task_id=task, adapter=adapters["upper"]).error is None
    assert generate(worker.grpc_url, prompt, 8, task_id=a).error is None  # a becomes most recently used
    assert generate(worker.grpc_url, prompt, 8, task_id=d, adapter=adapters["reverse"]).error is None
    evicted = generate(worker.grpc_url, prompt, 8, task_id=b)
    assert evicted.error is not None and re.fullmatch(MISS_RE.format(task=b), evicted.error)
    for task in (a, c, d):
        assert generate(worker.grpc_url, prompt, 8, task_id=task).error is None


def test_an_adapter_in_use_is_never_evicted(worker: WorkerProcess, adapters: dict[str, Adapter]) -> None:
    busy, b, c, d = (new_task_id() for _ in range(4))
    prompt = prompt_ids("abc")
    with Stream(worker.grpc_url) as long:
        long.send(
            request_inputs(
                prompt,
                LONG_TOKENS,
                task_id=busy,
                adapter=adapters["json"],
                streaming=True,
                end_id=NEVER_END_ID,
            )
        )
        long.wait_first_token()
        for task in (b, c, d):  # three more loads into a 3-adapter cache: the busy one must survive
            assert generate(worker.grpc_url, prompt, 4, task_id=task, adapter=adapters["upper"]).error is None
        assert long.result.final_at is None, "the long request ended too early for this test"
        assert generate(worker.grpc_url, prompt, 4, task_id=busy).error is None
        result = long.wait()
    assert result.error is None and len(result.tokens) == LONG_TOKENS
    assert generate(worker.grpc_url, prompt, 4, task_id=b).error is not None  # the LRU idle one went


def test_cache_full_when_every_adapter_is_in_use(
    worker: WorkerProcess, adapters: dict[str, Adapter], http: httpx.Client
) -> None:
    prompt = prompt_ids("abc")
    streams = [Stream(worker.grpc_url) for _ in range(HOST_ADAPTERS)]
    try:
        for stream, name in zip(streams, adapters, strict=True):
            stream.send(
                request_inputs(
                    prompt,
                    LONG_TOKENS,
                    task_id=new_task_id(),
                    adapter=adapters[name],
                    streaming=True,
                    end_id=NEVER_END_ID,
                )
            )
        for stream in streams:
            stream.wait_first_token()
        full = generate(worker.grpc_url, prompt, 4, task_id=new_task_id(), adapter=adapters["upper"])
        assert all(stream.result.final_at is None for stream in streams), "a long request ended too early"
    finally:
        for stream in streams:
            stream.close(cancel=True)  # the client cancels: the worker must end them and unpin their adapters
    assert full.error is not None and re.fullmatch(
        r"Executor failed process requestId \d+ due to the following error: "
        r"Cache is full\. There are no done tasks to evict",
        full.error,
    ), full.error
    wait_until(lambda: _idle(worker, http))
    assert generate(worker.grpc_url, prompt, 4, task_id=new_task_id(), adapter=adapters["upper"]).error is None


def test_a_short_request_finishes_while_a_long_one_decodes(worker: WorkerProcess) -> None:
    with Stream(worker.grpc_url) as long, Stream(worker.grpc_url) as short:
        long.send(request_inputs(prompt_ids("hello"), LONG_TOKENS, streaming=True, end_id=NEVER_END_ID))
        long.wait_first_token()
        short.send(request_inputs(prompt_ids("abc"), 4, streaming=True))
        short_result = short.wait()
        assert long.result.final_at is None  # still decoding when the short one is done
        long_result = long.wait()
    assert short_result.error is None and long_result.error is None
    assert short_result.final_at is not None and long_result.final_at is not None
    assert short_result.final_at < long_result.final_at
    assert len(long_result.tokens) == LONG_TOKENS


def test_stop_request_cancels_by_request_id(worker: WorkerProcess) -> None:
    with Stream(worker.grpc_url) as long, Stream(worker.grpc_url) as stopper:
        long.send(request_inputs(prompt_ids("hello"), LONG_TOKENS, streaming=True, end_id=NEVER_END_ID), "stop-me")
        long.wait_first_token()
        stopper.send(request_inputs([0], 1, stop=True), "stop-me")  # TRT-LLM's cancel: same request id
        assert stopper.wait().error is None
        result = long.wait()
    assert result.error is None and 0 < len(result.tokens) < LONG_TOKENS


def test_lora_validation_texts(worker: WorkerProcess, adapters: dict[str, Adapter]) -> None:
    prompt = prompt_ids("abc")
    no_id = generate(worker.grpc_url, prompt, 4, adapter=adapters["upper"])
    assert no_id.error is not None and no_id.error.endswith("lora_task_id must be set for LoRA inference")
    qkv = Adapter("qkv", adapters["upper"].weights, adapters["upper"].config.copy())
    qkv.config[0, :, 0] = 0  # attn_qkv: not among the engine's target modules
    wrong = generate(worker.grpc_url, prompt, 4, task_id=new_task_id(), adapter=qkv)
    assert wrong.error is not None and wrong.error.endswith("lora module attn_qkv not enabled for this model")


def test_metrics_have_the_trtllm_names_and_labels(worker: WorkerProcess, http: httpx.Client) -> None:
    generate(worker.grpc_url, prompt_ids("abc"), 4)
    text = http.get(worker.metrics_url).text
    families = {
        "nv_trt_llm_request_metrics": ("request_type", ("active", "max", "scheduled", "context", "waiting")),
        "nv_trt_llm_kv_cache_block_metrics": (
            "kv_cache_block_type",
            ("max", "free", "used", "tokens_per", "reused", "fraction"),
        ),
        "nv_trt_llm_inflight_batcher_metrics": (
            "inflight_batcher_specific_metric",
            ("total_context_tokens", "generation_requests", "micro_batch_id", "paused_requests"),
        ),
    }
    for family, (label, values) in families.items():
        assert f"# TYPE {family} gauge" in text
        for value in values:
            labels = sorted({label: value, "model": "tensorrt_llm", "version": "1"}.items())
            series = family + "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}"
            assert re.search(rf"^{re.escape(series)} [0-9.e+-]+$", text, re.MULTILINE), series
    assert 'nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 8' in text


def _reused_blocks(worker: WorkerProcess, http: httpx.Client) -> float:
    text = http.get(worker.metrics_url).text
    series = 'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="reused",model="tensorrt_llm",version="1"}'
    found = re.search(rf"^{re.escape(series)} ([0-9.e+]+)$", text, re.MULTILINE)
    assert found, series
    return float(found.group(1))


def test_a_shared_prefix_shows_as_reused_blocks(worker: WorkerProcess, http: httpx.Client) -> None:
    first = prompt_ids("A system prompt that every turn of this chat starts with, long enough for two blocks.")
    second = first[:-1] + TOKENIZER.encode(" And the user's next question?")
    assert len(first) > 64
    before = _reused_blocks(worker, http)
    assert generate(worker.grpc_url, first, 4).error is None
    assert generate(worker.grpc_url, second, 4).error is None
    wait_until(lambda: _reused_blocks(worker, http) >= before + 2)  # two full blocks of 32 tokens
    assert _reused_blocks(worker, http) == before + 2
