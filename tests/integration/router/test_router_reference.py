"""The router in front of three real reference workers (tritonserver, tiny Llama, TRT-LLM's LoRA contract):
adapter-specific answers through every front end, eviction behind the router's back, bad clients."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.integration.router.direct import direct_generate
from tests.integration.router.support import ConvertedAdapter, reference_workers, router_for
from tests.support.controlplane import eventually
from tests.unit.router.harness import RouterThread
from trtfleet.demand import RouterReading, parse_router_metrics

pytestmark = pytest.mark.integration

PROMPTS = ("hello world", "Route me well")
MAX_TOKENS = 24
DIRECT_TASK_ID_OFFSET = 500  # the expected answers use task ids the router never sends


@pytest.fixture(scope="module")
def fleet(converted_adapters: list[ConvertedAdapter]) -> Iterator[tuple[list[Any], RouterThread]]:
    with reference_workers() as workers, router_for(workers, converted_adapters) as router:
        yield workers, router
        router.check_books()


@pytest.fixture(scope="module")
def expected(fleet: tuple[list[Any], RouterThread], converted_adapters: list[ConvertedAdapter]) -> dict[Any, str]:
    """Answers asked of a worker directly, with weights (own task ids), before the router is used."""
    workers, _ = fleet
    answers: dict[Any, str] = {}
    for prompt in PROMPTS:
        answers[("tiny", prompt)] = direct_generate(workers[0], prompt, MAX_TOKENS)
        for adapter in converted_adapters:
            own = ConvertedAdapter(adapter.name, adapter.task_id + DIRECT_TASK_ID_OFFSET, adapter.path)
            answers[(adapter.name, prompt)] = direct_generate(workers[0], prompt, MAX_TOKENS, own)
    distinct = {answers[(a.name, PROMPTS[0])] for a in converted_adapters} | {answers[("tiny", PROMPTS[0])]}
    assert len(distinct) > 1, "the adapters do not change the model's answer: the test would prove nothing"
    return answers


def _openai(router: RouterThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=router.http_url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _metric(router: RouterThread, name: str) -> float:
    text = urllib.request.urlopen(router.metrics_url, timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def test_openai_answers_match_the_worker(
    fleet: tuple[list[Any], RouterThread], expected: dict[Any, str], converted_adapters: list[ConvertedAdapter]
) -> None:
    _, router = fleet
    client = _openai(router)
    for model in ["tiny", *(a.name for a in converted_adapters)]:
        for prompt in PROMPTS:
            want = expected[(model, prompt)]
            completion = client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS)
            assert completion.choices[0].text == want, (model, prompt)
            chat = client.chat.completions.create(
                model=model, max_tokens=MAX_TOKENS, messages=[{"role": "user", "content": prompt}]
            )
            assert chat.choices[0].message.content == want
            stream = client.chat.completions.create(
                model=model,
                max_tokens=MAX_TOKENS,
                stream=True,
                messages=[{"role": "user", "content": prompt}],
                stream_options={"include_usage": True},
            )
            chunks = list(stream)
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
            assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len(want.encode())
    assert _metric(router, "trtfleet_router_adapter_loads_total") >= len(converted_adapters)
    assert _metric(router, 'trtfleet_router_upstream_attempts_total{transport="http"}') > 0  # warm ones
    assert _metric(router, 'trtfleet_router_upstream_attempts_total{transport="grpc_shared"}') > 0  # with weights
    lag = "trtfleet_router_event_loop_lag_seconds_count"  # the probe runs in a started router
    eventually(lambda: _metric(router, lag) > 0, timeout=30, what="a loop lag sample")


def test_triton_clients_answers_match_the_worker(
    fleet: tuple[list[Any], RouterThread], expected: dict[Any, str], converted_adapters: list[ConvertedAdapter]
) -> None:
    _, router = fleet
    adapter, prompt = converted_adapters[1], PROMPTS[0]
    want = expected[(adapter.name, prompt)]
    http = httpclient.InferenceServerClient(router.http_url.removeprefix("http://"))
    inputs = [
        httpclient.InferInput("text_input", [1, 1], "BYTES"),
        httpclient.InferInput("max_tokens", [1, 1], "INT32"),
    ]
    inputs[0].set_data_from_numpy(np.array([[prompt.encode()]], dtype=object))
    inputs[1].set_data_from_numpy(np.array([[MAX_TOKENS]], dtype=np.int32))
    assert http.infer(adapter.name, inputs).as_numpy("text_output").reshape(-1)[0].decode() == want
    request = urllib.request.Request(
        router.http_url + f"/v2/models/{adapter.name}/generate",
        data=json.dumps({"text_input": prompt, "max_tokens": MAX_TOKENS}).encode(),
    )
    assert json.loads(urllib.request.urlopen(request, timeout=30).read())["text_output"] == want
    request = urllib.request.Request(
        router.http_url + f"/v2/models/{adapter.name}/generate_stream",
        data=json.dumps({"text_input": prompt, "max_tokens": MAX_TOKENS, "stream": True}).encode(),
    )
    body = urllib.request.urlopen(request, timeout=30).read().decode()
    events = [json.loads(block[6:]) for block in body.split("\n\n") if block.startswith("data: ")]
    assert "".join(e["text_output"] for e in events) == want and len(events) > 1
    grpc_client = grpcclient.InferenceServerClient(router.grpc_address)
    done, texts, errors = threading.Event(), [], []

    def callback(result: Any, error: Any) -> None:  # runs on tritonclient's thread: record, assert below
        if error is not None:
            errors.append(error)
            done.set()
            return
        output = result.as_numpy("text_output")
        if output is not None:
            texts.append(output.reshape(-1)[0])
        if result.get_response().parameters["triton_final_response"].bool_param:
            done.set()

    grpc_inputs = [
        grpcclient.InferInput("text_input", [1, 1], "BYTES"),
        grpcclient.InferInput("max_tokens", [1, 1], "INT32"),
        grpcclient.InferInput("stream", [1, 1], "BOOL"),
    ]
    grpc_inputs[0].set_data_from_numpy(np.array([[prompt.encode()]], dtype=object))
    grpc_inputs[1].set_data_from_numpy(np.array([[MAX_TOKENS]], dtype=np.int32))
    grpc_inputs[2].set_data_from_numpy(np.array([[True]]))
    grpc_client.start_stream(callback)
    grpc_client.async_stream_infer(adapter.name, grpc_inputs, enable_empty_final_response=True)
    assert done.wait(60), "no final response in 60 s"
    grpc_client.stop_stream()
    assert errors == []
    assert b"".join(texts).decode() == want and len(texts) > 1


def _resident(router: RouterThread, task_id: int) -> list[str]:
    debug = json.loads(
        urllib.request.urlopen(router.metrics_url.replace("/metrics", "/debug/fleets"), timeout=10).read()
    )
    return [pod["pod_id"] for pod in debug["tiny"]["pods"] if task_id in pod["resident_task_ids"]]


def test_eviction_behind_the_routers_back_is_recovered(
    fleet: tuple[list[Any], RouterThread], expected: dict[Any, str], converted_adapters: list[ConvertedAdapter]
) -> None:
    workers, router = fleet
    client = _openai(router)
    adapter, prompt = converted_adapters[0], PROMPTS[1]
    assert (
        client.completions.create(model=adapter.name, prompt=prompt, max_tokens=MAX_TOKENS).choices[0].text
        == expected[(adapter.name, prompt)]
    )
    holders = _resident(router, adapter.task_id)
    assert holders
    misses_before = _metric(router, "trtfleet_router_adapter_cache_misses_total")
    for pod in holders:  # fill each holder's two-adapter cache with adapters the router never heard of
        worker = workers[int(pod.removeprefix("w"))]
        for offset, other in enumerate(converted_adapters[1:3]):
            direct_generate(worker, "x", 2, ConvertedAdapter("intruder", 900 + offset, other.path))
    for _ in range(3):
        answer = client.completions.create(model=adapter.name, prompt=prompt, max_tokens=MAX_TOKENS)
        assert answer.choices[0].text == expected[(adapter.name, prompt)]
    assert _metric(router, "trtfleet_router_adapter_cache_misses_total") > misses_before


def _raw_http(router: RouterThread, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", router.router.http_port or 0), timeout=10) as sock:
        sock.sendall(payload)
        return sock.recv(4096)


def test_misbehaving_clients_do_not_hurt_others(
    fleet: tuple[list[Any], RouterThread], expected: dict[Any, str], converted_adapters: list[ConvertedAdapter]
) -> None:
    _, router = fleet
    failures: list[str] = []
    served = {adapter.name: 0 for adapter in converted_adapters[:3]}
    stop = threading.Event()

    def well_behaved(adapter: ConvertedAdapter) -> None:
        client = _openai(router)
        while not stop.is_set():
            try:
                answer = client.completions.create(model=adapter.name, prompt=PROMPTS[0], max_tokens=MAX_TOKENS)
            except openai.APIError as exc:  # an error, not only a wrong text, is what this test looks for
                failures.append(f"{adapter.name}: {type(exc).__name__}: {exc}")
                continue
            text = answer.choices[0].text
            if text != expected[(adapter.name, PROMPTS[0])]:
                failures.append(f"{adapter.name}: {text!r}")
            served[adapter.name] += 1

    threads = [threading.Thread(target=well_behaved, args=(a,)) for a in converted_adapters[:3]]
    for thread in threads:
        thread.start()
    try:
        assert b" 400 " in _raw_http(router, b"\x16\x03\x01\x02\x00garbage that is not HTTP\r\n\r\n")
        assert b" 400 " in _raw_http(router, b"\x00\xff\xfe nonsense \x01\x02\r\n\r\n")
        post = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        assert b" 400 " in _raw_http(router, post + b"Content-Length: 5\r\n\r\n{{{{{")
        huge = post + b"Content-Length: 99999999\r\n\r\n"
        assert b"413" in _raw_http(router, huge + b"{" * 1024)
        for _ in range(3):  # streams whose clients hang up after the first event
            body = json.dumps(
                {"model": converted_adapters[0].name, "prompt": "bye", "max_tokens": 40, "stream": True}
            ).encode()
            head = (
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
            )
            with socket.create_connection(("127.0.0.1", router.router.http_port or 0), timeout=30) as sock:
                sock.sendall(head + body)
                received = b""
                while b"data:" not in received:
                    received += sock.recv(4096)
            assert received.startswith(b"HTTP/1.1 200")  # and the client is gone after the first event
        with socket.create_connection(("127.0.0.1", router.router.http_port or 0)) as stalled:
            stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Len")  # never finishes
            before = dict(served)
            deadline = time.monotonic() + 60  # every good client served again while the stalled one hangs on
            while any(served.get(name, 0) <= count for name, count in before.items()) and not failures:
                assert time.monotonic() < deadline, "the well-behaved clients stopped being served"
                time.sleep(0.02)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert not any(thread.is_alive() for thread in threads), "a well-behaved client hung"
    assert not failures
    assert len(served) == len(threads) and all(count >= 1 for count in served.values()), served
    deadline = time.monotonic() + 10
    while router.router.lifecycle.inflight and time.monotonic() < deadline:
        time.sleep(0.05)
    router.check_books()


def _post_json(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode())
    doc: dict[str, Any] = json.loads(urllib.request.urlopen(request, timeout=30).read())
    return doc


def test_triton_generate_travels_over_http_with_every_output(fleet: tuple[list[Any], RouterThread]) -> None:
    # The router's generate answer is the pod's own, output for output, though it travels as JSON
    # (the reference BLS returns text_output only; every output type: tests/unit/router/server/test_triton_protocol.py).
    workers, router = fleet
    body = {"text_input": PROMPTS[1], "max_tokens": MAX_TOKENS, "id": "mine"}
    direct = _post_json(f"http://{workers[0].http_url}/v2/models/tensorrt_llm_bls/generate", body)
    http_attempts = 'trtfleet_router_upstream_attempts_total{transport="http"}'
    before = _metric(router, http_attempts)
    routed = _post_json(router.http_url + "/v2/models/tiny/generate", body)
    assert _metric(router, http_attempts) == before + 1
    assert routed.pop("model_name") == "tiny" and direct.pop("model_name") == "tensorrt_llm_bls"
    assert routed == direct


def _direct_stream_shapes(worker: Any, inputs: list[Any]) -> list[tuple[str, tuple[int, ...]]]:
    results: list[tuple[str, tuple[int, ...]]] = []
    errors: list[Any] = []
    done = threading.Event()
    client = grpcclient.InferenceServerClient(worker.grpc_url)

    def callback(result: Any, error: Any) -> None:  # runs on tritonclient's thread: record, assert below
        if error is not None:
            errors.append(error)
            done.set()
            return
        output = result.as_numpy("text_output")
        if output is not None:
            results.append((b"".join(output.reshape(-1).tolist()).decode(), output.shape))
        if result.get_response().parameters["triton_final_response"].bool_param:
            done.set()

    client.start_stream(callback)
    client.async_stream_infer("tensorrt_llm_bls", inputs, enable_empty_final_response=True)
    assert done.wait(60), "no final response in 60 s"
    client.stop_stream()
    assert errors == []
    return results


def test_tensor_requests_travel_over_http_with_grpc_shapes(fleet: tuple[list[Any], RouterThread]) -> None:
    # tritonclient's ModelInfer (gRPC) and infer (HTTP) on the router go to the pod as generate JSON when
    # warm; the client still gets Triton's gRPC answer: same text, same output shape.
    workers, router = fleet
    prompt = PROMPTS[1]
    inputs = [
        grpcclient.InferInput("text_input", [1, 1], "BYTES"),
        grpcclient.InferInput("max_tokens", [1, 1], "INT32"),
    ]
    inputs[0].set_data_from_numpy(np.array([[prompt.encode()]], dtype=object))
    inputs[1].set_data_from_numpy(np.array([[MAX_TOKENS]], dtype=np.int32))
    [(want_text, want_shape)] = _direct_stream_shapes(workers[0], inputs)
    http_attempts = 'trtfleet_router_upstream_attempts_total{transport="http"}'
    before = _metric(router, http_attempts)
    output = grpcclient.InferenceServerClient(router.grpc_address).infer("tiny", inputs).as_numpy("text_output")
    assert (output.reshape(-1)[0].decode(), output.shape) == (want_text, want_shape)
    http_inputs = [
        httpclient.InferInput("text_input", [1, 1], "BYTES"),
        httpclient.InferInput("max_tokens", [1, 1], "INT32"),
    ]
    http_inputs[0].set_data_from_numpy(np.array([[prompt.encode()]], dtype=object))
    http_inputs[1].set_data_from_numpy(np.array([[MAX_TOKENS]], dtype=np.int32))
    http = httpclient.InferenceServerClient(router.http_url.removeprefix("http://"))
    output = http.infer("tiny", http_inputs).as_numpy("text_output")
    assert (output.reshape(-1)[0].decode(), output.shape) == (want_text, want_shape)
    assert _metric(router, http_attempts) == before + 2


def _status(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_bad_input_is_a_400_and_no_pod_failure(
    fleet: tuple[list[Any], RouterThread], converted_adapters: list[ConvertedAdapter]
) -> None:
    _, router = fleet
    adapter = converted_adapters[0].name
    failures_before = _metric(router, "trtfleet_router_pod_failures_total")
    text_inputs = [
        {"name": "text_input", "datatype": "BYTES", "shape": [1, 1], "data": ["hi"]},
        {"name": "max_tokens", "datatype": "INT32", "shape": [1, 1], "data": [4]},
    ]
    cases = [
        ("/v1/completions", {"model": adapter, "prompt": "hi", "max_tokens": 4, "seed": -1}),
        ("/v1/chat/completions", {"model": adapter, "messages": [{"role": "user", "content": "hi"}], "seed": -1}),
        (f"/v2/models/{adapter}/generate", {"text_input": "hi"}),
        (f"/v2/models/{adapter}/infer", {"inputs": text_inputs, "outputs": [{"name": "no_such_output"}]}),
    ]
    for path, body in cases:
        status, doc = _status(router.http_url + path, body)
        assert status == 400, (path, doc)
        assert isinstance(doc["error"], dict if path.startswith("/v1") else str), doc
    # integer request parameters reach tritonserver as int64 (it refuses unsigned ones)
    status, doc = _status(
        router.http_url + f"/v2/models/{adapter}/generate",
        {"text_input": "hi", "max_tokens": 4, "parameters": {"user_tag": 3, "offset": -2}},
    )
    assert status == 200 and doc["text_output"], doc
    assert _metric(router, "trtfleet_router_pod_failures_total") == failures_before
    assert router.router.fleets.ejected("tiny") == frozenset()


def test_the_pods_load_reaches_the_operator_through_the_router(fleet: tuple[list[Any], RouterThread]) -> None:
    """The router exports the load it scraped from every worker; the operator's parser reads it from there
    (the operator scrapes no pod: trtllm-serve's JSON /metrics gives each reader only part of the stream)."""
    workers, router = fleet

    def reading() -> RouterReading | None:
        text = urllib.request.urlopen(router.metrics_url, timeout=10).read().decode()
        got = parse_router_metrics(text, "tiny")
        return got if got.pods_reporting == len(workers) else None

    got = eventually(reading, timeout=30, what="every worker's load in the router's metrics")
    assert got.pod_requests >= 0 and got.pod_kv_fraction is not None and 0 <= got.pod_kv_fraction <= 1
