"""The endpoint picker over its real gRPC port, driven by an ext_proc client playing the gateway (no Envoy).

The cases llm-d-router's hermetic tests cover: a body split across chunks, header-only requests, no ready pod,
missing and unknown models, subset hint match / partial / none, SSE responses streamed back, the rewrite, a pod
that fails under load. Two fleets: ``pytorch`` pods (trtllm-serve; the picker never calls them, so their addresses
need not answer) and Triton pods served by echo upstreams (the picker reads the model config and pushes cold
adapters' weights over gRPC).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from trtfleet_router.epp.exchange import PickerSettings

from tests.support import extproc
from tests.support.controlplane import eventually
from tests.support.extproc import PickerStream, response_body, response_headers
from tests.unit.router.harness import EchoFleet, LoopThread, RouterThread, write_artifact

PYTORCH_PODS = {"p0": "10.9.0.1:8000", "p1": "10.9.0.2:8000", "p2": "10.9.0.3:8000"}


def _pytorch_fleet(tmp: Path, **fields: Any) -> dict[str, Any]:
    adapters = []
    for index, name in enumerate(("upper", "reverse"), start=1):
        write_artifact(tmp / name, seed=index)
        adapters.append({"servedName": f"tiny-{name}", "taskId": 10 + index, "artifact": str(tmp / name)})
    backends = [{"address": address, "podId": pod} for pod, address in PYTORCH_PODS.items()]
    return {"baseModels": [{
        "name": "tiny", "runtime": "pytorch", "architecture": "reference", "maxInputLen": 4096, "maxSeqLen": 8192,
        "hostPages": 4, "devicePages": 2, "backends": backends, "adapters": adapters, **fields,
    }]}


class Picker:
    """A router with its endpoint-picker port, and ext_proc streams to it."""

    def __init__(self, router: RouterThread, loop: LoopThread | None = None) -> None:
        self.router = router
        self.loop = loop
        self.channel = grpc.insecure_channel(f"127.0.0.1:{router.router.picker_port_bound}")

    def stream(self) -> PickerStream:
        return PickerStream(self.channel)

    def completion(self, body: dict[str, Any], *, chunks: int = 1, **options: Any) -> extproc.Picked:
        stream = self.stream()
        picked = stream.request("/v1/completions", json.dumps(body).encode(), chunks=chunks, **options)
        if picked.immediate is None:
            stream.send(response_headers(200), response_body(b'{"model":"reference"}', end_of_stream=True))
            assert len(stream.finish()) == 2
        return picked

    def open_tickets(self) -> int:
        return sum(fleet.snapshot().open_tickets for fleet in self.router.router.fleets.fleets.values())

    def close(self) -> None:
        self.channel.close()


@pytest.fixture
def pytorch_picker(tmp_path: Path) -> Iterator[Picker]:
    loop = LoopThread()
    router = RouterThread(loop, _pytorch_fleet(tmp_path), picker=PickerSettings(fallbacks=1), picker_port=0)
    picker = Picker(router, loop)
    yield picker
    picker.close()
    router.stop()
    loop.close()


@pytest.fixture
def triton_picker(tmp_path: Path) -> Iterator[tuple[Picker, EchoFleet]]:
    fleet = EchoFleet(tmp_path, count=2, host_pages=2, picker=PickerSettings(), picker_port=0)
    picker = Picker(fleet.router)
    yield picker, fleet
    picker.close()
    fleet.close()


def test_a_body_in_chunks_goes_to_one_pod_rewritten_for_trtllm_serve(pytorch_picker: Picker) -> None:
    body = {"model": "tiny-upper", "prompt": "hello " * 400, "max_tokens": 4, "temperature": 0, "stream": True,
            "user": "ignored-by-trtllm-serve"}
    picked = pytorch_picker.completion(body, chunks=5)
    assert picked.immediate is None
    assert picked.destinations[0] in PYTORCH_PODS.values()
    assert picked.metadata_destination == picked.headers[extproc.DESTINATION]  # header and metadata agree
    assert picked.headers[":path"] == "/v1/completions"
    assert picked.first.request_headers.response.clear_route_cache
    sent = picked.json()
    assert sent["model"] == "tiny"  # the base model trtllm-serve serves, the adapter in lora_request
    assert sent["lora_request"] == {"lora_name": "tiny-upper", "lora_int_id": 11, "lora_path": sent["lora_request"][
        "lora_path"]} and sent["lora_request"]["lora_path"]
    assert sent["prompt"] == body["prompt"] and sent["stream"] is True
    assert "user" not in sent and "stream_options" not in sent  # what trtllm-serve refuses, what the client asked
    assert pytorch_picker.open_tickets() == 0


def test_header_only_requests(pytorch_picker: Picker) -> None:
    models = pytorch_picker.stream().request("/v1/models", None)
    assert models.status == 200
    assert {card["id"] for card in models.answer()["data"]} >= {"tiny", "tiny-upper", "tiny-reverse"}
    stream = pytorch_picker.stream()
    health = stream.request("/health", None)
    assert health.immediate is None and health.destinations[0] in PYTORCH_PODS.values()
    assert not health.bodies  # nothing to stream for a request without a body
    counts = [_epp_requests(pytorch_picker, code, kind="unknown") for code in ("ok", "client_gone")]
    stream.send(response_headers(200, end_of_stream=True))
    assert [answer.WhichOneof("response") for answer in stream.finish()] == ["response_headers"]
    pytorch_picker.router.check_books()  # an answer without a body ends its lease with the headers
    eventually(lambda: sum(_epp_requests(pytorch_picker, code, kind="unknown") for code in ("ok", "client_gone"))
               > sum(counts), timeout=30, what="the request counted")
    assert _epp_requests(pytorch_picker, "client_gone", kind="unknown") == counts[1]  # the client had all of it


def test_refusals_carry_status_and_an_openai_error_body(tmp_path: Path) -> None:
    loop = LoopThread()
    fleet = _pytorch_fleet(tmp_path)
    fleet["baseModels"][0]["backends"] = []  # no pod at all, and requests are not held for one
    router = RouterThread(loop, fleet, picker=PickerSettings(), picker_port=0, routing=_no_hold())
    picker = Picker(router, loop)
    try:
        missing = picker.completion({"prompt": "x"})
        assert missing.status == 400 and missing.answer()["error"]["type"] == "invalid_request_error"
        unknown = picker.completion({"model": "nope", "prompt": "x"})
        assert unknown.status == 404 and unknown.answer()["error"]["code"] == "model_not_found"
        no_pod = picker.completion({"model": "tiny-upper", "prompt": "x"})
        assert no_pod.status == 503
        headers = {o.header.key: o.header.raw_value for o in no_pod.immediate.headers.set_headers}  # type: ignore[union-attr]
        assert int(headers["retry-after"]) >= 1
        bad_json = picker.stream().request("/v1/completions", b"{not json")
        assert bad_json.status == 400
        triton = picker.stream().request("/v2/models/nope/generate", b'{"text_input": "x"}')
        assert triton.status == 404 and "error" in triton.answer() and isinstance(triton.answer()["error"], str)
        assert picker.open_tickets() == 0
    finally:
        picker.close()
        router.stop()
        loop.close()


def _no_hold() -> Any:
    from trtfleet_router.routing.policies import parse_routing_config

    return parse_routing_config({"holdWaitS": 0})


def test_the_subset_hint_narrows_the_pick(pytorch_picker: Picker) -> None:
    only = PYTORCH_PODS["p1"]
    for _ in range(6):
        picked = pytorch_picker.completion({"model": "tiny-upper", "prompt": "x"}, subset=[only])
        assert picked.destinations == [only]  # no fallback outside the subset either
    partial = pytorch_picker.completion({"model": "tiny-reverse", "prompt": "x"},
                                        subset=[PYTORCH_PODS["p2"], "10.99.0.1:8000"])
    assert partial.destinations == [PYTORCH_PODS["p2"]]
    for subset in (["10.99.0.1:8000"], []):
        refused = pytorch_picker.completion({"model": "tiny-upper", "prompt": "x"}, subset=subset)
        assert refused.status == 503, subset
    assert pytorch_picker.open_tickets() == 0


def test_warm_first_and_fallbacks(pytorch_picker: Picker) -> None:
    first = pytorch_picker.completion({"model": "tiny-upper", "prompt": "x"})
    assert len(first.destinations) == 2 and len(set(first.destinations)) == 2  # --epp-fallbacks 1
    again = pytorch_picker.completion({"model": "tiny-upper", "prompt": "x"})
    assert again.destinations[0] == first.destinations[0]  # the adapter is warm there now


def test_sse_answers_stream_back_and_the_lease_ends_with_the_body(pytorch_picker: Picker) -> None:
    stream = pytorch_picker.stream()
    picked = stream.request("/v1/completions", json.dumps(
        {"model": "tiny-upper", "prompt": "x", "stream": True}).encode())
    assert picked.immediate is None and pytorch_picker.open_tickets() == 1
    stream.send(response_headers(200, {"content-type": "text/event-stream"}))
    assert stream.receive().WhichOneof("response") == "response_headers"
    chunks = [b'data: {"model":"tiny","choices":[{"text":"A"}]}\n\n', b'data: {"choices":[{"text":"B"}]}\n\n',
              b"data: [DONE]\n\n"]
    for index, chunk in enumerate(chunks):
        stream.send(response_body(chunk, end_of_stream=index == len(chunks) - 1))
        echoed = stream.receive().response_body.response.body_mutation.streamed_response
        assert echoed.end_of_stream == (index == len(chunks) - 1)
        assert echoed.body == chunk.replace(b'"model":"tiny"', b'"model":"tiny-upper"')  # the client's name back
    assert stream.finish() == []
    assert pytorch_picker.open_tickets() == 0


def test_a_failing_pod_is_blamed_and_left(pytorch_picker: Picker) -> None:
    """Envoy's own 503 (it could not reach the pod) counts against the pod; after three, the pod is ejected."""
    failed: set[str] = set()
    for _ in range(3):
        stream = pytorch_picker.stream()
        picked = stream.request("/v1/completions", b'{"model": "tiny-upper", "prompt": "x"}')
        victim = picked.destinations[0]
        failed.add(victim)
        stream.send(response_headers(503), response_body(b"upstream connect error or disconnect/reset before "
                                                         b"headers. reset reason: connection failure",
                                                         end_of_stream=True))
        stream.finish()
    assert len(failed) == 1  # the adapter's warm pod, until it is ejected
    after = {pytorch_picker.completion({"model": "tiny-upper", "prompt": "x"}).destinations[0] for _ in range(4)}
    assert after.isdisjoint(failed)
    assert pytorch_picker.open_tickets() == 0


def test_a_client_that_leaves_ends_the_lease(pytorch_picker: Picker) -> None:
    stream = pytorch_picker.stream()
    stream.request("/v1/completions", b'{"model": "tiny-upper", "prompt": "x", "stream": true}')
    stream.send(response_headers(200, {"content-type": "text/event-stream"}))
    stream.receive()
    assert pytorch_picker.open_tickets() == 1
    stream.cancel()
    pytorch_picker.router.check_books()  # the ticket ends without the body's end


def test_the_gateway_served_a_fallback(pytorch_picker: Picker) -> None:
    stream = pytorch_picker.stream()
    picked = stream.request("/v1/completions", b'{"model": "tiny-reverse", "prompt": "x"}')
    primary, fallback = picked.destinations
    stream.send(response_headers(200, served=fallback), response_body(b"{}", end_of_stream=True))
    stream.finish()
    pods = {address: pod for pod, address in PYTORCH_PODS.items()}
    fleet = pytorch_picker.router.router.fleets.fleet("tiny")
    assert fleet.is_warm(pods[fallback], 12)  # the answer came from the fallback: its cache holds the adapter
    assert pytorch_picker.open_tickets() == 0
    assert primary != fallback


def test_triton_generate_is_rewritten_and_a_cold_pod_gets_the_weights_first(
    triton_picker: tuple[Picker, EchoFleet]
) -> None:
    picker, fleet = triton_picker
    stream = picker.stream()
    picked = stream.request("/v2/models/a1/generate", b'{"text_input": "hello", "max_tokens": 4}', chunks=2)
    assert picked.headers[":path"] == "/v2/models/tensorrt_llm_bls/generate"
    assert picked.json() == {"text_input": "hello", "max_tokens": 4, "lora_task_id": 101}
    upstream_http = {backend["http"]: index for index, backend in enumerate(fleet.fleet["baseModels"][0]["backends"])}
    pod = upstream_http[picked.destinations[0]]
    assert 101 in fleet.upstreams[pod].cache  # pushed over gRPC before the request went id-only
    stream.send(response_headers(200), response_body(b'{"model_name":"tensorrt_llm_bls","text_output":"x"}',
                                                     end_of_stream=True))
    answers = stream.finish()
    assert answers[1].response_body.response.body_mutation.streamed_response.body == (
        b'{"model_name":"a1","text_output":"x"}')
    assert picker.open_tickets() == 0


def test_a_miss_the_gateway_reports_marks_the_adapter_cold(triton_picker: tuple[Picker, EchoFleet]) -> None:
    picker, _fleet = triton_picker
    first = picker.stream()
    picked = first.request("/v2/models/a2/generate", b'{"text_input": "x", "max_tokens": 1}')
    first.send(response_headers(200), response_body(b"{}", end_of_stream=True))
    first.finish()
    pods = {endpoint.http_address: pod for pod, endpoint in picker.router.router.fleets.pods["tiny"].items()}
    pod = pods[picked.destinations[0]]
    fleet = picker.router.router.fleets.fleet("tiny")
    assert fleet.is_warm(pod, 102)
    second = picker.stream()
    again = second.request("/v2/models/a2/generate", b'{"text_input": "x", "max_tokens": 1}')
    assert again.destinations[0] == picked.destinations[0]
    second.send(response_headers(400), response_body(
        b'{"error":"LoRA task 102 not found in cache. Please send LoRA weights with request"}', end_of_stream=True))
    second.finish()
    assert not fleet.is_warm(pod, 102)
    assert picker.router.router.metrics.adapter_cache_misses.labels("a2").value == 1
    assert picker.open_tickets() == 0


def test_a_body_over_the_limit_is_refused_with_413(tmp_path: Path) -> None:
    from trtfleet_router.server.common import FrontendSettings

    loop = LoopThread()
    router = RouterThread(loop, _pytorch_fleet(tmp_path), picker=PickerSettings(), picker_port=0,
                          frontend=FrontendSettings(max_body_bytes=1024))
    picker = Picker(router, loop)
    try:
        refused = picker.completion({"model": "tiny-upper", "prompt": "x" * 2000}, chunks=4)
        assert refused.status == 413 and refused.answer()["error"]["message"].startswith("the request body exceeds")
        assert picker.completion({"model": "tiny-upper", "prompt": "x"}).immediate is None
        assert picker.open_tickets() == 0
    finally:
        picker.close()
        router.stop()
        loop.close()


def _epp_requests(picker: Picker, code: str, kind: str = "adapter") -> float:
    counter = picker.router.router.metrics.requests.labels("epp", kind, code)
    return float(counter.value)


def test_a_gateway_that_closes_after_the_whole_answer_counts_it_served(pytorch_picker: Picker) -> None:
    """Envoy may reset the stream once the client has read an OpenAI stream's [DONE], before the body's last empty
    chunk: a served request, not a client gone; a reset in the middle of the answer is a client gone."""
    ok, gone = _epp_requests(pytorch_picker, "ok"), _epp_requests(pytorch_picker, "client_gone")
    for finished in (True, False):
        stream = pytorch_picker.stream()
        stream.request("/v1/completions", b'{"model": "tiny-upper", "prompt": "x", "stream": true}')
        stream.send(response_headers(200, {"content-type": "text/event-stream"}))
        stream.receive()
        last = b"data: [DONE]\n\n" if finished else b'data: {"choices":[{"text":"A"}]}\n\n'
        stream.send(response_body(b'data: {"choices":[{"text":"A"}]}\n\n' + last, end_of_stream=False))
        stream.receive()
        stream.cancel()
        pytorch_picker.router.check_books()
    # the request is counted as its handler ends, a moment after its lease closed
    def counted() -> tuple[float, float]:
        return _epp_requests(pytorch_picker, "ok"), _epp_requests(pytorch_picker, "client_gone")

    eventually(lambda: sum(counted()) >= ok + gone + 2, timeout=30, what="both streams counted")
    assert counted() == (ok + 1, gone + 1)  # the whole answer served, the cut one a client gone


def test_a_whole_answer_by_its_content_length_is_served_when_the_gateway_closes_before_its_end(
    pytorch_picker: Picker,
) -> None:
    """A JSON answer is whole once its content-length has passed: a gateway that closes the stream before the empty
    end-of-stream chunk has served it, and its books are kept before the last bytes go back to the gateway."""
    ok, gone = _epp_requests(pytorch_picker, "ok"), _epp_requests(pytorch_picker, "client_gone")
    answer = b'{"model": "tiny", "choices": [{"text": "A"}]}'
    for whole in (True, False):
        stream = pytorch_picker.stream()
        stream.request("/v1/completions", b'{"model": "tiny-upper", "prompt": "x"}')
        stream.send(response_headers(200, {"content-type": "application/json", "content-length": str(len(answer))}))
        stream.receive()
        stream.send(response_body(answer if whole else answer[:10], end_of_stream=False))
        stream.receive()
        stream.cancel()
        pytorch_picker.router.check_books()
    def counted() -> tuple[float, float]:
        return _epp_requests(pytorch_picker, "ok"), _epp_requests(pytorch_picker, "client_gone")

    eventually(lambda: sum(counted()) >= ok + gone + 2, timeout=30, what="both streams counted")
    assert counted() == (ok + 1, gone + 1)  # the whole answer served, the cut one a client gone


def test_a_gateway_that_follows_no_response_hands_the_request_over(pytorch_picker: Picker) -> None:
    """A gateway that closes its side once it has the destination (NGINX Gateway Fabric's client sends the headers,
    the body, then closes): the lease ends as answered, the adapter is booked on the pod it went to."""
    ok = _epp_requests(pytorch_picker, "ok")
    stream = pytorch_picker.stream()
    picked = stream.request("/v1/completions", b'{"model": "tiny-reverse", "prompt": "x"}')
    assert stream.finish() == []
    pytorch_picker.router.check_books()
    pods = {address: pod for pod, address in PYTORCH_PODS.items()}
    assert pytorch_picker.router.router.fleets.fleet("tiny").is_warm(pods[picked.destinations[0]], 12)
    eventually(lambda: _epp_requests(pytorch_picker, "ok") == ok + 1, timeout=30, what="the request counted")
