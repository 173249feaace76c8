"""``trtfleet worker --merged-adapter DIR`` (Adapter mode: merged) as a real process, both runtimes.

A merged worker serves one adapter folded into the base weights, with no LoRA inputs; its greedy outputs
equal the committed outputs of the same adapter hot-swapped on the base model (which the dynamic reference
engine is tested against: tests/integration/reference/test_reference_serve.py, test_reference_worker.py).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
from trtfleet_engines.reference.numpy_llama import SAMPLE_ADAPTER_NAMES, SAMPLE_ADAPTERS_DIR
from trtfleet_engines.reference.server import free_port
from trtfleet_engines.reference.tokenizer import prompt_ids

from tests.integration.reference.serve_process import trtfleet_worker
from tests.integration.reference.triton_client import generate
from tests.support.lora_outputs import FIXTURE

pytestmark = pytest.mark.integration

MAX_TOKENS: int = FIXTURE["max_new_tokens"]


@pytest.mark.parametrize("name", SAMPLE_ADAPTER_NAMES)
def test_pytorch_worker_serves_a_merged_adapter_under_its_name(name: str, tmp_path: Path) -> None:
    port = free_port()
    args = ["--runtime", "pytorch", "--http-port", str(port), "--merged-adapter", str(SAMPLE_ADAPTERS_DIR / name)]
    with trtfleet_worker(tmp_path, args, ready_path="/health", port=port):
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=30).json()
        assert [m["id"] for m in models["data"]] == [name]
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=60)
        for prompt, want in zip(FIXTURE["prompts"], FIXTURE["models"][name]["outputs"], strict=True):
            completion = client.completions.create(model=name, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
            assert completion.choices[0].text == want, (name, prompt)


@pytest.mark.parametrize("name", SAMPLE_ADAPTER_NAMES)
def test_triton_worker_serves_a_merged_adapter_without_lora_inputs(name: str, tmp_path: Path) -> None:
    http, grpc, metrics = free_port(), free_port(), free_port()
    args = ["--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics),
            "--merged-adapter", str(SAMPLE_ADAPTERS_DIR / name)]
    with trtfleet_worker(tmp_path, args, ready_path="/v2/health/ready", port=http):
        url = f"127.0.0.1:{grpc}"
        for prompt, want in zip(FIXTURE["prompts"], FIXTURE["models"][name]["output_ids"], strict=True):
            result = generate(url, prompt_ids(prompt), MAX_TOKENS)
            assert result.error is None and result.tokens == want, (name, prompt, result.error)
        refused = generate(url, prompt_ids("abc"), 4, task_id=7)
        assert refused.error is not None and "lora_task_id" in refused.error, refused.error  # no LoRA inputs
