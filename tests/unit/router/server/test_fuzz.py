"""Fuzzing the request schemas (hypothesis, derandomized, bounded) against a running router in front of echo
upstreams (real gRPC and HTTP servers with the LoRA cache contract; no model): OpenAI completions and
chat, Triton generate and infer. Whatever the body, the router answers below 500, and every error body has
the front end's format (OpenAI ``{"error": {"message", "type", "param", "code"}}``, Triton ``{"error": str}``);
a streamed answer is well-formed SSE to its end."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.router.harness import EchoFleet

EXAMPLES = 200
FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
small_ints = st.integers(min_value=-5, max_value=300) | st.sampled_from([0, 2**31, 2**63, 2**64, -(2**63) - 1])


def mostly(valid: st.SearchStrategy[Any], wild: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``valid`` five times in six, else ``wild``: most requests get through to a pod, the rest probe edges."""

    @st.composite
    def pick(draw: st.DrawFn) -> Any:
        return draw(wild if draw(st.integers(0, 5)) == 0 else valid)

    return pick()


def _body(
    required: dict[str, st.SearchStrategy[Any]], optional: dict[str, st.SearchStrategy[Any]]
) -> st.SearchStrategy[Any]:
    """A JSON object: ``required`` keys (each left out now and then), some ``optional`` ones, now and then an
    unknown key; one body in twenty is any JSON value at all."""

    @st.composite
    def build(draw: st.DrawFn) -> Any:
        if draw(st.integers(0, 19)) == 0:
            return draw(json_values)
        body = {key: draw(strategy) for key, strategy in required.items() if draw(st.integers(0, 14))}
        body.update({key: draw(strategy) for key, strategy in optional.items() if draw(st.integers(0, 3)) == 0})
        if draw(st.integers(0, 9)) == 0:
            body.update(draw(st.dictionaries(st.text(max_size=8), json_values, min_size=1, max_size=2)))
        return body

    return build()


models = mostly(st.sampled_from(["tiny", "a1", "a2"]), st.sampled_from(["nope", ""]) | json_scalars)
prompts = mostly(st.text(max_size=60), json_values)
max_tokens = mostly(st.integers(1, 40), small_ints | json_scalars)
sampling = {
    "temperature": mostly(st.floats(0, 2), st.floats(-1, 3, allow_nan=False) | json_scalars),
    "top_p": mostly(st.floats(0, 1), json_scalars),
    "seed": mostly(st.integers(0, 2**64 - 1), st.integers(-(2**65), 2**65) | json_scalars),
    "stop": mostly(
        st.text(min_size=1, max_size=5) | st.lists(st.text(min_size=1, max_size=5), max_size=4), json_values
    ),
    "stream": mostly(st.booleans(), json_scalars),
    "n": mostly(st.just(1), small_ints),
    "presence_penalty": mostly(st.floats(-2, 2), json_scalars),
    "stream_options": mostly(st.fixed_dictionaries({"include_usage": st.booleans()}), json_values),
}
completions = _body({"model": models, "prompt": prompts, "max_tokens": max_tokens}, sampling)
message = st.fixed_dictionaries(
    {
        "role": mostly(st.sampled_from(["system", "user", "assistant"]), json_scalars),
        "content": mostly(st.text(max_size=40), json_values),
    }
)
chat = _body(
    {
        "model": models,
        "messages": mostly(st.lists(message, min_size=1, max_size=3), json_values),
        "max_tokens": max_tokens,
    },
    sampling,
)
generate = _body(
    {"text_input": prompts, "max_tokens": max_tokens},
    {
        "stream": mostly(st.booleans(), json_scalars),
        "temperature": mostly(st.floats(0, 2), json_scalars),
        "seed": mostly(st.integers(0, 2**64 - 1), st.integers(-(2**65), 2**65) | json_scalars),
        "lora_task_id": mostly(st.sampled_from([101, 102]), small_ints | json_scalars),
        "parameters": mostly(st.dictionaries(st.text(max_size=6), json_scalars, max_size=3), json_scalars),
        "stop_words": mostly(st.lists(st.text(min_size=1, max_size=5), max_size=3), json_values),
    },
)


def _tensor(name: str, datatype: str, values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    valid = st.fixed_dictionaries(
        {
            "name": st.just(name),
            "datatype": st.just(datatype),
            "shape": st.just([1, 1]),
            "data": values.map(lambda v: [v]),
        }
    )
    wild = st.fixed_dictionaries(
        {
            "name": st.sampled_from([name, "x"]) | json_scalars,
            "datatype": st.sampled_from(["BYTES", "INT32", "INT64", "UINT64", "FP32", "FP16", "BOOL", "nope"]),
            "shape": st.lists(st.integers(-2, 4), max_size=3) | json_scalars,
        },
        optional={"data": st.lists(json_scalars, max_size=4) | json_values, "parameters": json_values},
    )
    return mostly(valid, wild)


infer_inputs = st.tuples(
    _tensor("text_input", "BYTES", st.text(max_size=40)),
    _tensor("max_tokens", "INT32", st.integers(1, 40)),
    st.lists(
        _tensor("stream", "BOOL", st.booleans()) | _tensor("seed", "UINT64", st.integers(0, 2**64 - 1)), max_size=1
    ),
).map(lambda parts: [parts[0], parts[1], *parts[2]])
infer = _body(
    {"inputs": mostly(infer_inputs, json_values)},
    {
        "outputs": st.lists(
            st.fixed_dictionaries({"name": mostly(st.just("text_output"), st.text(max_size=12) | json_scalars)}),
            max_size=2,
        ),
        "parameters": mostly(st.dictionaries(st.text(max_size=6), json_scalars, max_size=3), json_scalars),
        "id": json_scalars,
    },
)


@pytest.fixture(scope="module")
def echo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EchoFleet]:
    fleet = EchoFleet(tmp_path_factory.mktemp("fuzz"), count=2)
    try:
        yield fleet
    finally:
        fleet.close()


def _post(echo: EchoFleet, path: str, body: Any) -> tuple[int, str, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", echo.router.router.http_port, timeout=30)
    try:
        connection.request("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.getheader("Content-Type", ""), response.read()
    finally:
        connection.close()


def _check_openai_error(doc: Any) -> None:
    assert isinstance(doc, dict) and set(doc) == {"error"}
    error = doc["error"]
    assert isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str)


def _check_triton_error(doc: Any) -> None:
    assert isinstance(doc, dict) and set(doc) == {"error"} and isinstance(doc["error"], str) and doc["error"]


def check_answer(status: int, content_type: str, payload: bytes, check_error: Any) -> None:
    assert status < 500, payload[:500]
    if content_type.startswith("text/event-stream"):
        events = [line[len(b"data:") :].strip() for line in payload.splitlines() if line.startswith(b"data:")]
        for event in events:
            if event != b"[DONE]":
                doc = json.loads(event)
                if "error" in doc:
                    check_error(doc)
        return
    doc = json.loads(payload) if payload else None
    if status >= 400:
        check_error(doc)


@FUZZ
@given(body=completions)
def test_openai_completions(echo: EchoFleet, body: Any) -> None:
    check_answer(*_post(echo, "/v1/completions", body), _check_openai_error)


@FUZZ
@given(body=chat)
def test_openai_chat(echo: EchoFleet, body: Any) -> None:
    check_answer(*_post(echo, "/v1/chat/completions", body), _check_openai_error)


@FUZZ
@given(
    model=st.sampled_from(["tiny", "a1", "nope"]),
    action=st.sampled_from(["generate", "generate_stream"]),
    body=generate,
)
def test_triton_generate(echo: EchoFleet, model: str, action: str, body: Any) -> None:
    check_answer(*_post(echo, f"/v2/models/{model}/{action}", body), _check_triton_error)


@FUZZ
@given(model=st.sampled_from(["tiny", "a2", "nope"]), body=infer)
def test_triton_infer(echo: EchoFleet, model: str, body: Any) -> None:
    check_answer(*_post(echo, f"/v2/models/{model}/infer", body), _check_triton_error)
