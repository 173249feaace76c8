"""The whole router in-process against echo upstreams (real gRPC servers with the LoRA cache contract):
OpenAI and Triton clients, miss recovery, back-pressure, pod failures, broken streams, limits, keys, drain."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException
from trtfleet_router.server.triton_http import split_model_path

from tests.unit.router.harness import EchoFleet
from trtfleet.loracache import FULL_TEXT


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EchoFleet]:
    echo = EchoFleet(tmp_path_factory.mktemp("echo"))
    yield echo
    echo.router.check_books()
    echo.close()


def _client(fleet: EchoFleet, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=fleet.router.http_url + "/v1", api_key=key, max_retries=0)


def _post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_openai_completions_and_chat(fleet: EchoFleet) -> None:
    client = _client(fleet)
    out = client.completions.create(model="a1", prompt="hello", max_tokens=50)
    assert out.choices[0].text == "[101] hello" and out.choices[0].finish_reason == "stop"
    assert out.usage is not None and out.usage.prompt_tokens == 7 and out.usage.completion_tokens == 11
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}], max_tokens=1
    )
    assert chat.choices[0].message.content == "h" and chat.choices[0].finish_reason == "length"
    models = {m.id: m for m in client.models.list().data}
    assert set(models) == {"tiny", "a1", "a2"} and models["a1"].owned_by == "trtfleet"
    assert models["a1"].model_dump()["parent"] == "tiny"


def test_openai_streaming(fleet: EchoFleet) -> None:
    client = _client(fleet)
    chunks = list(
        client.chat.completions.create(
            model="a2",
            messages=[{"role": "user", "content": "stream me"}],
            max_tokens=50,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "[102] stream me"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == "stop" and chunks[-1].usage is not None
    pieces = [
        c.choices[0].text for c in client.completions.create(model="a2", prompt="abcdefgh", max_tokens=50, stream=True)
    ]
    assert "".join(pieces) == "[102] abcdefgh" and len(pieces) > 3


def test_miss_recovery_is_invisible(fleet: EchoFleet) -> None:
    client = _client(fleet)
    client.completions.create(model="a1", prompt="warm", max_tokens=50)
    misses_before = sum(u.stats.misses for u in fleet.upstreams)
    for upstream in fleet.upstreams:  # evict behind the router's back
        upstream.cache.evict(101)
    out = client.completions.create(model="a1", prompt="after eviction", max_tokens=50)
    assert out.choices[0].text == "[101] after eviction"
    assert sum(u.stats.misses for u in fleet.upstreams) == misses_before + 1
    metrics = urllib.request.urlopen(fleet.router.metrics_url).read().decode()
    assert 'trtfleet_router_adapter_cache_misses_total{adapter="a1"}' in metrics
    assert 'trtfleet_router_upstream_retries_total{reason="miss"}' in metrics


def test_client_errors(fleet: EchoFleet) -> None:
    client = _client(fleet)
    with pytest.raises(openai.NotFoundError) as not_found:
        client.completions.create(model="nope", prompt="x")
    assert not_found.value.body == {
        "message": "The model 'nope' does not exist",
        "type": "not_found_error",
        "param": "model",
        "code": "model_not_found",
    }
    with pytest.raises(openai.BadRequestError, match="n=1"):
        client.completions.create(model="a1", prompt="x", n=2)
    with pytest.raises(openai.BadRequestError, match="logprobs"):
        client.chat.completions.create(model="a1", messages=[{"role": "user", "content": "x"}], logprobs=True)
    with pytest.raises(openai.BadRequestError, match="256 input tokens"):
        client.completions.create(model="a1", prompt="x" * 300)
    url = fleet.router.http_url + "/v1/completions"
    status, _, body = _post(url, b"{not json")
    assert status == 400 and json.loads(body)["error"]["type"] == "invalid_request_error"
    status, _, _ = _post(url, b'{"model": "a1", "prompt": "' + b"x" * (9 * 1024 * 1024) + b'"}')
    assert status == 413


def test_triton_http(fleet: EchoFleet) -> None:
    client = httpclient.InferenceServerClient(fleet.router.http_url.removeprefix("http://"))
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("a1")
    assert client.get_model_metadata("a1")["name"] == "a1"
    assert client.get_model_config("a1")["name"] == "a1"
    inputs = [
        httpclient.InferInput("text_input", [1, 1], "BYTES"),
        httpclient.InferInput("max_tokens", [1, 1], "INT32"),
    ]
    inputs[0].set_data_from_numpy(np.array([[b"tensor"]], dtype=object))
    inputs[1].set_data_from_numpy(np.array([[32]], dtype=np.int32))
    result = client.infer("a1", inputs, outputs=[httpclient.InferRequestedOutput("text_output")])
    assert result.as_numpy("text_output").tolist() == [[b"[101] tensor"]]
    json_inputs = [
        httpclient.InferInput("text_input", [1, 1], "BYTES"),
        httpclient.InferInput("max_tokens", [1, 1], "INT32"),
    ]
    json_inputs[0].set_data_from_numpy(np.array([[b"as json"]], dtype=object), binary_data=False)
    json_inputs[1].set_data_from_numpy(np.array([[32]], dtype=np.int32), binary_data=False)
    result = client.infer(
        "tiny", json_inputs, outputs=[httpclient.InferRequestedOutput("text_output", binary_data=False)]
    )
    assert result.as_numpy("text_output").tolist() == [["as json"]]  # JSON BYTES come back as str
    with pytest.raises(InferenceServerException, match="does not exist"):
        client.infer("nope", inputs)
    base = fleet.router.http_url + "/v2/models/a2/"
    status, _, body = _post(base + "generate", json.dumps({"text_input": "gen", "max_tokens": 20}).encode())
    assert status == 200 and json.loads(body)["text_output"] == "[102] gen"
    status, headers, body = _post(
        base + "generate_stream", json.dumps({"text_input": "stream", "max_tokens": 20, "stream": True}).encode()
    )
    events = [json.loads(line[6:]) for line in body.decode().split("\n\n") if line.startswith("data: ")]
    assert status == 200 and "".join(e["text_output"] for e in events) == "[102] stream" and len(events) > 1
    status, _, body = _post(base + "generate", json.dumps({"text_input": "x", "bogus": 1}).encode())
    assert status == 400 and "unexpected inference input" in json.loads(body)["error"]
    # versioned paths reach the same handlers (the router serves every version as the one it has)
    assert client.is_model_ready("a1", "1") and client.get_model_metadata("a1", "1")["name"] == "a1"
    assert client.get_model_config("a1", "1")["name"] == "a1"
    result = client.infer("a1", inputs, model_version="1", outputs=[httpclient.InferRequestedOutput("text_output")])
    assert result.as_numpy("text_output").tolist() == [[b"[101] tensor"]]
    status, _, body = _post(base + "versions/1/generate", json.dumps({"text_input": "v", "max_tokens": 20}).encode())
    assert status == 200 and json.loads(body)["text_output"] == "[102] v"
    # the wrong method names the right one
    status, headers, body = _post(base + "ready", b"{}")
    assert status == 405 and headers["Allow"] == "GET" and "GET only" in json.loads(body)["error"]
    try:
        urllib.request.urlopen(base + "generate", timeout=10)
        raise AssertionError("GET generate was accepted")
    except urllib.error.HTTPError as exc:
        assert exc.code == 405 and exc.headers["Allow"] == "POST"


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("m", ("m", None, "")),
        ("m/ready", ("m", None, "ready")),
        ("m/versions/3", ("m", "3", "")),
        ("m/versions/3/generate_stream", ("m", "3", "generate_stream")),
        ("org/adapter/infer", ("org/adapter", None, "infer")),
        ("org/adapter/versions/1/config", ("org/adapter", "1", "config")),
        ("m/versions/1/2", ("m/versions/1/2", None, "")),  # not a version: a name with slashes
        ("generate", ("generate", None, "")),  # a model named like an action
        ("m/other", ("m/other", None, "")),
    ],
)
def test_split_model_path(path: str, expected: tuple[str, str | None, str]) -> None:
    assert split_model_path(path) == expected


def test_triton_grpc(fleet: EchoFleet) -> None:
    client = grpcclient.InferenceServerClient(fleet.router.grpc_address)
    assert client.is_server_ready() and client.is_model_ready("a2")
    assert client.get_model_metadata("a2").name == "a2"
    inputs = [
        grpcclient.InferInput("text_input", [1, 1], "BYTES"),
        grpcclient.InferInput("max_tokens", [1, 1], "INT32"),
        grpcclient.InferInput("stream", [1, 1], "BOOL"),
    ]
    inputs[0].set_data_from_numpy(np.array([[b"grpc words"]], dtype=object))
    inputs[1].set_data_from_numpy(np.array([[40]], dtype=np.int32))
    inputs[2].set_data_from_numpy(np.array([[True]]))
    assert client.infer("a2", inputs).as_numpy("text_output").tolist() == [[b"[102] grpc words"]]
    results: list[tuple[object, object]] = []
    done = threading.Event()

    def callback(result: object, error: object) -> None:
        results.append((result, error))
        if error is not None or result.get_response().parameters["triton_final_response"].bool_param:  # type: ignore[attr-defined]
            done.set()

    client.start_stream(callback)
    client.async_stream_infer("a2", inputs, request_id="s1", enable_empty_final_response=True)
    assert done.wait(10)
    client.stop_stream()
    assert all(error is None for _, error in results)
    texts = [r.as_numpy("text_output") for r, _ in results]  # type: ignore[attr-defined]
    assert b"".join(t[0][0] for t in texts if t is not None) == b"[102] grpc words" and len(texts) > 2
    assert all(r.get_response().id == "s1" and r.get_response().model_name == "a2" for r, _ in results)  # type: ignore[attr-defined]
    unary_stream = threading.Event()
    unary_results: list[object] = []

    def unary_callback(result: object, error: object) -> None:
        unary_results.append(error or result)
        if error is not None or result.get_response().parameters["triton_final_response"].bool_param:  # type: ignore[attr-defined]
            unary_stream.set()

    inputs[2].set_data_from_numpy(np.array([[False]]))
    client.start_stream(unary_callback)  # a whole answer over ModelStreamInfer (upstream: one response, final)
    client.async_stream_infer("a2", inputs, request_id="u1", enable_empty_final_response=True)
    assert unary_stream.wait(10)
    client.stop_stream()
    answer, final = unary_results
    assert answer.as_numpy("text_output").tolist() == [[b"[102] grpc words"]]  # type: ignore[attr-defined]
    assert final.as_numpy("text_output") is None  # type: ignore[attr-defined]
    with pytest.raises(InferenceServerException) as info:
        client.infer("nope", inputs)
    assert info.value.status() == "StatusCode.NOT_FOUND"
    long_inputs = [
        grpcclient.InferInput("text_input", [1, 1], "BYTES"),
        grpcclient.InferInput("max_tokens", [1, 1], "INT32"),
    ]
    long_inputs[0].set_data_from_numpy(np.array([[b"x" * 400]], dtype=object))
    long_inputs[1].set_data_from_numpy(np.array([[4]], dtype=np.int32))
    with pytest.raises(InferenceServerException) as info:
        client.infer("a2", long_inputs)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_back_pressure_moves_to_another_pod_then_429(tmp_path: Path) -> None:
    echo = EchoFleet(tmp_path, count=2)
    try:
        client = _client(echo)
        echo.upstreams[0].fail_with = FULL_TEXT
        for i in range(4):
            assert client.completions.create(model="a1", prompt=f"p{i}", max_tokens=40).choices[0].text == f"[101] p{i}"
        echo.upstreams[1].fail_with = "Maximum queue size of 8 has been reached, please try again later"
        with pytest.raises(openai.RateLimitError) as info:
            client.completions.create(model="a1", prompt="x", max_tokens=40)
        assert info.value.response.headers["retry-after"] == "1"
        echo.router.check_books()
    finally:
        echo.close()


def test_pod_failures_before_and_after_the_first_token(tmp_path: Path) -> None:
    echo = EchoFleet(tmp_path, count=2, chunk_chars=2, chunk_delay_s=0.15)
    try:
        client = _client(echo)
        echo.stop_upstream(0)
        for i in range(3):  # retried on the live pod, invisibly
            assert client.completions.create(model="a1", prompt=f"q{i}", max_tokens=40).choices[0].text == f"[101] q{i}"
        stream = client.completions.create(model="a2", prompt="a long answer", max_tokens=40, stream=True)
        first = next(iter(stream))
        assert first.choices[0].text
        echo.stop_upstream(1)
        with pytest.raises(openai.APIError, match="broke after it started"):
            list(stream)
        with pytest.raises(openai.APIStatusError) as info:
            client.completions.create(model="a1", prompt="nobody left", max_tokens=40)
        assert info.value.status_code == 503 and info.value.response.headers["retry-after"]
        echo.router.check_books()
    finally:
        echo.close()


def test_client_disconnect_cancels_upstream_and_keeps_serving(tmp_path: Path) -> None:
    echo = EchoFleet(tmp_path, count=1, chunk_chars=1, chunk_delay_s=0.05)
    try:
        client = _client(echo)
        with client.completions.create(model="a1", prompt="x" * 100, max_tokens=200, stream=True) as stream:
            next(iter(stream))
        deadline = time.monotonic() + 5
        while echo.router.router.lifecycle.inflight and time.monotonic() < deadline:
            time.sleep(0.02)
        assert echo.router.router.lifecycle.inflight == 0
        echo.router.check_books()
        assert (
            client.completions.create(model="a1", prompt="still here", max_tokens=40).choices[0].text.endswith("here")
        )
    finally:
        echo.close()


def test_api_keys(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text("keys:\n- {name: a, key: sk-only-a1-0000, models: [a1]}\n- {name: all, key: sk-everything-00}\n")
    echo = EchoFleet(tmp_path, count=1, api_keys_path=keys)
    try:
        with pytest.raises(openai.AuthenticationError):
            _client(echo, "sk-wrong-000000").completions.create(model="a1", prompt="x", max_tokens=4)
        restricted = _client(echo, "sk-only-a1-0000")
        assert restricted.completions.create(model="a1", prompt="x", max_tokens=40).choices[0].text == "[101] x"
        with pytest.raises(openai.PermissionDeniedError):
            restricted.completions.create(model="a2", prompt="x", max_tokens=4)
        assert [m.id for m in restricted.models.list().data] == ["a1"]
        assert len(_client(echo, "sk-everything-00").models.list().data) == 3
        grpc_client = grpcclient.InferenceServerClient(echo.router.grpc_address)
        with pytest.raises(InferenceServerException) as info:
            grpc_client.is_model_ready("a1")
        assert info.value.status() == "StatusCode.UNAUTHENTICATED"
        assert grpc_client.is_model_ready("a1", headers={"authorization": "Bearer sk-only-a1-0000"})
    finally:
        echo.close()


def test_a_keys_own_body_limit_holds_on_every_front_end_and_no_key_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text("keys:\n- {name: small, key: sk-small-bodies-1, maxBodyBytes: 200}\n"
                    "- {name: big, key: sk-large-bodies-2}\n")
    echo = EchoFleet(tmp_path, count=1, api_keys_path=keys)
    long_prompt = "x" * 220  # a body over 200 bytes, a prompt within the engine's 256
    try:
        with caplog.at_level("DEBUG"):
            small, big = _client(echo, "sk-small-bodies-1"), _client(echo, "sk-large-bodies-2")
            assert small.completions.create(model="a1", prompt="short", max_tokens=8).choices[0].text
            with pytest.raises(openai.APIStatusError) as too_large:
                small.completions.create(model="a1", prompt=long_prompt, max_tokens=4)
            assert too_large.value.status_code == 413
            assert big.completions.create(model="a1", prompt=long_prompt, max_tokens=4).choices[0].text
            with pytest.raises(openai.AuthenticationError):  # refused on its key, before its body is read
                _client(echo, "sk-not-a-key-0000").completions.create(model="a1", prompt=long_prompt, max_tokens=4)
            generate = urllib.request.Request(
                f"{echo.router.http_url}/v2/models/a1/generate", method="POST",
                data=json.dumps({"text_input": long_prompt, "max_tokens": 4}).encode(),
                headers={"Authorization": "Bearer sk-small-bodies-1", "Content-Type": "application/json"})
            with pytest.raises(urllib.error.HTTPError) as triton_http:
                urllib.request.urlopen(generate, timeout=10)
            assert triton_http.value.code == 413
            grpc_client = grpcclient.InferenceServerClient(echo.router.grpc_address)
            text = grpcclient.InferInput("text_input", [1, 1], "BYTES")
            text.set_data_from_numpy(np.array([[long_prompt.encode()]], dtype=object))
            with pytest.raises(InferenceServerException) as grpc_error:
                grpc_client.infer("a1", [text], headers={"authorization": "Bearer sk-small-bodies-1"})
            assert grpc_error.value.status() == "StatusCode.INVALID_ARGUMENT"
            assert "limit is 200" in str(grpc_error.value.message())
    finally:
        echo.close()
    logged = "\n".join(f"{record.getMessage()} {record.__dict__}" for record in caplog.records
                       if record.name.startswith("trtfleet_router"))
    assert "request" in logged and not any(key in logged for key in ("sk-small", "sk-large", "sk-not-a-key"))


def test_drain_finishes_inflight_and_refuses_new(tmp_path: Path) -> None:
    echo = EchoFleet(tmp_path, count=1, chunk_chars=1, chunk_delay_s=0.02, drain_timeout_s=10.0)
    try:
        client = _client(echo)
        prompt = "drain me " * 15  # about 140 pieces 20 ms apart: the stream outlives the late request
        stream = client.completions.create(model="a1", prompt=prompt, max_tokens=200, stream=True)
        iterator = iter(stream)
        first = next(iterator).choices[0].text
        stop_errors: list[BaseException] = []

        def stop() -> None:
            try:
                echo.router.stop()
            except BaseException as exc:  # reported below: a thread's exception would only be a warning
                stop_errors.append(exc)

        stopping = threading.Thread(target=stop)
        stopping.start()
        lifecycle = echo.router.router.lifecycle
        deadline = time.monotonic() + 10
        while not lifecycle.draining:
            assert time.monotonic() < deadline, "the router never started draining"
            time.sleep(0.005)
        with pytest.raises(openai.APIStatusError) as info:
            client.completions.create(model="a1", prompt="late", max_tokens=4)
        assert info.value.status_code == 503
        assert first + "".join(c.choices[0].text for c in iterator) == "[101] " + prompt
        stopping.join(15)
        assert not stopping.is_alive(), "the drain did not finish"
        assert stop_errors == []
    finally:
        for server in echo.servers:
            echo.loop.run(server.stop(None))
        echo.loop.close()
