"""The router in front of a ``pytorch`` fleet that speculates: reference trtllm-serve workers started with the
options file trtfleet renders for an n-gram ``spec.speculative``, the official openai client.

Every answer is the fixture's greedy output, which is what the same fleet gives without speculation
(``test_router_pytorch.py``, and the real transformers/PEFT models that wrote the fixture): speculation changes
no token. The pods' acceptance counters reach the router's ``/metrics`` per pod, per base model and per
adapter, in an exposition Prometheus parses. The same through reference tritonserver workers (the Triton face).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from trtfleet_engines.pytorch.options import render_llm_api_options
from trtfleet_engines.reference.repository import default_reference_spec

from tests.integration.reference.serve_process import ServeProcess, serving
from tests.integration.reference.triton_client import wait_until
from tests.integration.router.sample_fleet import (
    ADAPTERS,
    MAX_TOKENS,
    OUTPUTS,
    PROMPTS,
    check_each_prompts_output,
    openai_client,
    pytorch_fleet_config,
    served_name,
    start_router,
)
from tests.integration.router.support import ConvertedAdapter, reference_workers, router_for
from tests.unit.router.harness import RouterThread
from trtfleet.api import BaseModelSpec

pytestmark = pytest.mark.integration

WORKER_ARGS = ["--served_model_name", "tiny", "--max-loras", "2", "--max-cpu-loras", "3", "--max-lora-rank", "8"]


def _samples(router: RouterThread, family: str) -> dict[tuple[tuple[str, str], ...], float]:
    text = httpx.get(router.metrics_url, timeout=10).text
    out: dict[tuple[tuple[str, str], ...], float] = {}
    for metric in text_string_to_metric_families(text):  # what Prometheus would parse
        for sample in metric.samples:
            if sample.name == family:
                out[tuple(sorted(sample.labels.items()))] = sample.value
    return out


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[ServeProcess], RouterThread]]:
    tmp = tmp_path_factory.mktemp("speculating-fleet")
    spec = BaseModelSpec.model_validate(default_reference_spec().to_wire() | {
        "speculative": {"mode": "NGram", "maxDraftLen": 4, "ngram": {"maxMatchingNgramSize": 3}}})
    options = tmp / "llm-api-options.yaml"
    options.write_text(render_llm_api_options(spec))
    with ExitStack() as stack:
        workers = [stack.enter_context(serving(tmp, [*WORKER_ARGS, "--config", str(options)])) for _ in range(2)]
        backends = [{"address": w.url.removeprefix("http://"), "metrics": w.url.removeprefix("http://"),
                     "podId": f"w{i}"} for i, w in enumerate(workers)]  # the router scrapes GET /metrics
        config: dict[str, Any] = pytorch_fleet_config(backends, workers[0].lora_cache())
        yield workers, start_router(stack, config)


@pytest.mark.parametrize("name", ["base", *ADAPTERS])
def test_speculating_pods_give_exactly_the_greedy_outputs(fleet: tuple[list[ServeProcess], RouterThread],
                                                          name: str) -> None:
    check_each_prompts_output(openai_client(fleet[1]), name, usage=True)


def test_acceptance_reaches_the_routers_metrics(fleet: tuple[list[ServeProcess], RouterThread]) -> None:
    router = fleet[1]
    client = openai_client(router)
    for name in ("base", *ADAPTERS):
        client.completions.create(model=served_name(name), prompt="abc abc abc abc", max_tokens=24, temperature=0)

    def accepted() -> float:
        return sum(_samples(router, "trtfleet_router_spec_decode_accepted_tokens_total").values())

    wait_until(lambda: accepted() > 0, timeout_s=30)
    drafted = sum(_samples(router, "trtfleet_router_spec_decode_draft_tokens_total").values())
    assert 0 < accepted() <= drafted
    per_pod = _samples(router, "trtfleet_router_pod_spec_decode_acceptance_ratio")
    assert per_pod and all(0.0 <= value <= 1.0 for value in per_pod.values())
    assert all(dict(labels)["base_model"] == "tiny" for labels in per_pod)
    tokens = _samples(router, "trtfleet_router_pod_spec_decode_tokens_per_step")
    assert tokens and all(value >= 1.0 for value in tokens.values())
    wait_until(lambda: len(_samples(router, "trtfleet_router_adapter_spec_decode_acceptance_ratio")) >= 2,
               timeout_s=30)
    ratios = _samples(router, "trtfleet_router_adapter_spec_decode_acceptance_ratio")
    adapters = {dict(labels)["adapter"] for labels in ratios}
    assert "base" in adapters and adapters & {served_name(n) for n in ADAPTERS}
    assert _samples(router, "trtfleet_router_pod_decode_steps_per_second")


def test_the_triton_face_speculates_behind_the_router(converted_adapters: list[ConvertedAdapter]) -> None:
    """Reference tritonserver workers drafting by prompt lookup: the fixture's greedy outputs through the router's
    OpenAI front end, and the pods' speculation counters (the reference engine's own family) at the router."""
    spec = BaseModelSpec.model_validate(default_reference_spec().to_wire() | {
        "speculative": {"mode": "NGram", "maxDraftLen": 4}})
    with reference_workers(2, spec=spec) as workers, router_for(workers, converted_adapters) as router:
        client = openai_client(router)
        served = {adapter.name for adapter in converted_adapters}
        for name in ("base", *ADAPTERS):
            model = served_name(name)
            assert name == "base" or model in served
            for prompt, want in zip(PROMPTS, OUTPUTS[name], strict=True):
                completion = client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS,
                                                       temperature=0)
                assert completion.choices[0].text == want, (name, prompt)
        wait_until(lambda: sum(_samples(router, "trtfleet_router_spec_decode_accepted_tokens_total").values()) > 0,
                   timeout_s=30)
        assert _samples(router, "trtfleet_router_pod_spec_decode_tokens_per_step")
        wait_until(lambda: len(_samples(router, "trtfleet_router_adapter_spec_decode_acceptance_ratio")) >= 2,
                   timeout_s=30)
