"""Fuzzing the endpoint-picker port (hypothesis, derandomized, bounded): malformed streams, wrong orders, huge and
broken bodies, garbage metadata. Whatever a gateway (or anyone who reaches the port) sends, the picker never
crashes, a refused request changes nothing in the fleet's books, and every stream's lease ends with the stream.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trtfleet_router.epp.exchange import PickerSettings

from tests.support import extproc
from tests.unit.router.epp.test_picker_protocol import PYTORCH_PODS, Picker, _pytorch_fleet
from tests.unit.router.harness import LoopThread, RouterThread

FUZZ = settings(
    max_examples=80,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

paths = st.sampled_from(["/v1/completions", "/v1/chat/completions", "/v2/models/tiny-upper/generate", "/v1/models",
                         "/", "/v2/models//generate", "/v1/completions?x=1"]) | st.text(max_size=20)
bodies = (
    st.binary(max_size=64)
    | st.builds(lambda model, prompt: json.dumps({"model": model, "prompt": prompt}).encode(),
                st.sampled_from(["tiny", "tiny-upper", "nope", ""]), st.text(max_size=30))
    | st.just(b"{" * 5000)
    | st.just(b'{"model": "tiny-upper", "prompt": "' + b"x" * 200_000 + b'"}')
)
header_values = st.dictionaries(st.sampled_from(["x-request-id", "authorization", "x-gateway-inference-fairness-id",
                                                 "content-type", ":method"]), st.text(max_size=40), max_size=3)


@st.composite
def streams(draw: st.DrawFn) -> list[ext_proc.ProcessingRequest]:
    """A message sequence in any order a broken or hostile gateway might send."""
    messages = [extproc.request_headers(draw(paths), draw(st.sampled_from(["POST", "GET", "PUT", ""])),
                                        draw(header_values), end_of_stream=draw(st.booleans()),
                                        subset=draw(st.none() | st.lists(st.text(max_size=20), max_size=3)))]
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["body", "body_end", "response_headers", "response_body", "headers_again"]))
        if kind == "body" or kind == "body_end":
            messages.append(extproc.request_body(draw(bodies), end_of_stream=kind == "body_end"))
        elif kind == "response_headers":
            status = draw(st.sampled_from([200, 400, 503, 0, 999]))
            messages.append(extproc.response_headers(status, served=draw(st.none() | st.text(max_size=20))))
        elif kind == "response_body":
            messages.append(extproc.response_body(draw(st.binary(max_size=64)), end_of_stream=draw(st.booleans())))
        else:
            messages.append(extproc.request_headers("/v1/completions"))
    return messages


@pytest.fixture(scope="module")
def picker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Picker]:
    loop = LoopThread()
    tmp: Path = tmp_path_factory.mktemp("fuzz")
    router = RouterThread(loop, _pytorch_fleet(tmp), picker=PickerSettings(fallbacks=1), picker_port=0)
    found = Picker(router, loop)
    yield found
    found.close()
    router.stop()
    loop.close()


def _warm_sets(picker: Picker) -> dict[str, list[int]]:
    fleet = picker.router.router.fleets.fleet("tiny")
    return {pod: sorted(state.residency.cache.resident()) for pod, state in fleet.pods.items()}


@FUZZ
@given(messages=streams())
def test_whatever_arrives_the_picker_stands_and_its_books_balance(picker: Picker, messages: list) -> None:
    before = _warm_sets(picker)
    stream = picker.stream()
    stream.send(*messages)
    answers: list[ext_proc.ProcessingResponse] = []
    try:
        answers = stream.finish()
    except grpc.RpcError as exc:  # the picker may end a stream it cannot follow; it must not hang or crash
        assert exc.code() in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.CANCELLED, grpc.StatusCode.INVALID_ARGUMENT)
    picker.router.check_books(settle_s=5)
    refused = answers and answers[0].WhichOneof("response") == "immediate_response"
    if refused:
        assert _warm_sets(picker) == before  # a refused request leaves no trace in the fleet's view
    # and the port still serves a good request
    good = picker.completion({"model": "tiny-upper", "prompt": "x"})
    assert good.immediate is None and good.destinations[0] in PYTORCH_PODS.values()
