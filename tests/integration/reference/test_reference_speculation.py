"""Speculative decoding in the reference engine on both its faces, as real processes: with n-gram drafting on, every
greedy output is still the real transformers/PEFT model's (``tests/fixtures/lora/expected_outputs.json``), for the
base model and each adapter, and the acceptance counters come out as TRT-LLM exports them: ``trtllm_spec_decode_*``
and the JSON ``specDecodingStats`` on the trtllm-serve face, the per-request ``total_draft_tokens`` /
``total_accepted_draft_tokens`` / ``acceptance_rate`` outputs on the Triton face (plus the reference engine's own
families, on both)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from trtfleet_engines.pytorch.options import render_llm_api_options
from trtfleet_engines.reference.repository import default_reference_spec
from trtfleet_engines.reference.server import WorkerProcess
from trtfleet_engines.reference.tokenizer import decode, prompt_ids
from trtfleet_engines.reference.workers import running_worker

from tests.integration.reference.serve_process import ServeProcess, lora_request, serving
from tests.integration.reference.tiny import new_task_id, sample_adapters
from tests.integration.reference.triton_client import MODEL, request_inputs
from tests.support.lora_outputs import FIXTURE, OUTPUTS, PROMPTS, SAMPLE_ADAPTERS
from trtfleet.api import BaseModelSpec

pytestmark = pytest.mark.integration

TASK_IDS = {"upper": 1, "reverse": 2, "json": 3}
SPECULATIVE = {"mode": "NGram", "maxDraftLen": 4, "ngram": {"maxMatchingNgramSize": 3}}


def speculative_spec() -> BaseModelSpec:
    return BaseModelSpec.model_validate(default_reference_spec().to_wire() | {"speculative": SPECULATIVE})


def _value(text: str, pattern: str) -> float:
    match = re.search(pattern, text, re.MULTILINE)
    assert match is not None, f"{pattern!r} not in the metrics"
    return float(match.group(1))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    tmp = tmp_path_factory.mktemp("serve-spec")
    options = tmp / "llm-api-options.yaml"
    options.write_text(render_llm_api_options(speculative_spec()))
    with serving(tmp, ["--config", str(options), "--served_model_name", "tiny"]) as process:
        yield process


@pytest.mark.parametrize("name", ["base", *SAMPLE_ADAPTERS])
def test_trtllm_serve_face_speculates_without_changing_a_token(server: ServeProcess, name: str) -> None:
    client = server.client()
    extra = None if name == "base" else lora_request(name, TASK_IDS[name])
    for prompt, want in zip(PROMPTS, OUTPUTS[name], strict=True):
        completion = client.completions.create(model="tiny", prompt=prompt, max_tokens=64, temperature=0,
                                               extra_body=extra)
        assert completion.choices[0].text == want, (name, prompt)
        streamed = client.completions.create(model="tiny", prompt=prompt, max_tokens=64, stream=True,
                                             extra_body=extra)
        assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == want


def test_trtllm_serve_face_exports_acceptance(server: ServeProcess) -> None:
    client = server.client()
    for prompt in PROMPTS:
        client.completions.create(model="tiny", prompt=prompt, max_tokens=64, temperature=0)
    entries = server.get("/metrics").json()
    spec = [entry["specDecodingStats"] for entry in entries if "specDecodingStats" in entry]
    drafted = sum(s["numDraftTokens"] for s in spec)
    accepted = sum(s["numAcceptedTokens"] for s in spec)
    assert 0 < accepted <= drafted
    text = server.get("/prometheus/metrics").text
    total_drafted = _value(text, r"^trtllm_spec_decode_num_draft_tokens_total\{[^}]*\} (\S+)")
    total_accepted = _value(text, r"^trtllm_spec_decode_num_accepted_tokens_total\{[^}]*\} (\S+)")
    assert 0 < total_accepted <= total_drafted and total_drafted >= drafted
    assert _value(text, r"^trtllm_spec_decode_acceptance_length\{[^}]*\} (\S+)") >= 1.0
    assert _value(text, r'^trtfleet_reference_spec_decode_adapter_accepted_tokens_total\{lora_id="0"\} (\S+)') > 0


# -- the Triton face ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def worker() -> Iterator[WorkerProcess]:
    with running_worker(spec=speculative_spec()) as started:
        yield started


def _infer(url: str, prompt: str, task_id: int | None, adapter: Any) -> dict[str, Any]:
    client = grpcclient.InferenceServerClient(url)
    results: list[Any] = []
    client.start_stream(callback=lambda result, error: results.append(error or result))
    outputs = [grpcclient.InferRequestedOutput(name) for name in (
        "output_ids", "total_draft_tokens", "total_accepted_draft_tokens", "acceptance_rate")]
    inputs = request_inputs(prompt_ids(prompt), FIXTURE["max_new_tokens"], task_id=task_id, adapter=adapter)
    client.async_stream_infer(MODEL, inputs, outputs=outputs)
    client.stop_stream()  # waits for the outstanding response
    client.close()
    (result,) = results
    assert not isinstance(result, Exception), result
    return {name: result.as_numpy(name) for name in ("output_ids", "total_draft_tokens",
                                                     "total_accepted_draft_tokens", "acceptance_rate")}


@pytest.mark.parametrize("name", ["base", *SAMPLE_ADAPTERS])
def test_triton_face_speculates_without_changing_a_token(worker: WorkerProcess, name: str) -> None:
    adapter = sample_adapters().get(name)
    task_id = None if adapter is None else new_task_id()
    drafted = accepted = 0
    for index, prompt in enumerate(PROMPTS):
        out = _infer(worker.grpc_url, prompt, task_id, adapter)
        tokens = out["output_ids"].reshape(-1).tolist()
        assert tokens == FIXTURE["models"][name]["output_ids"][index], (name, prompt, decode(tokens))
        d, a = int(out["total_draft_tokens"].item()), int(out["total_accepted_draft_tokens"].item())
        rate = float(out["acceptance_rate"].item())
        assert 0 <= a <= d and rate == pytest.approx(a / d if d else 0.0, abs=1e-6)
        drafted, accepted = drafted + d, accepted + a
    if name == "base":
        assert accepted > 0, "the base model echoes its prompt: prompt lookup drafts it"
    text = httpx.get(worker.metrics_url, timeout=10).text
    assert _value(text, r'^trtfleet_reference_spec_decode_metrics\{[^}]*spec_decode_type="draft_tokens"[^}]*\} (\S+)') \
        >= drafted
    assert np.isfinite(_value(text, r'^trtfleet_reference_spec_decode_metrics\{[^}]*spec_decode_type='
                                    r'"acceptance_length"[^}]*\} (\S+)'))


def test_the_options_file_of_a_reference_spec_names_ngram(tmp_path: Path) -> None:
    rendered = render_llm_api_options(speculative_spec())
    assert "decoding_type: NGram" in rendered and "disable_overlap_scheduler: true" in rendered
