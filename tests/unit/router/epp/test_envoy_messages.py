"""The endpoint-picker protocol's messages (pure): what the picker reads from the gateway and what it answers."""

from __future__ import annotations

import json

import pytest
from trtfleet_router.epp import envoy
from trtfleet_router.epp.request import GatewayRequest
from trtfleet_router.routing.tenancy import FAIRNESS_HEADERS, OBJECTIVE_HEADERS, first_header

from tests.support.extproc import metadata


@pytest.mark.parametrize(
    ("subset", "want"),
    [
        (None, None),  # no hint: every endpoint of the pool
        (["10.0.0.1:8000", "10.0.0.2:8000"], frozenset({"10.0.0.1:8000", "10.0.0.2:8000"})),
        ([], frozenset()),  # an empty hint allows nothing (the picker answers 503)
    ],
)
def test_subset_hint(subset: list[str] | None, want: frozenset[str] | None) -> None:
    assert envoy.subset_hint(metadata(subset=subset)) == want


def test_served_endpoint_from_metadata_then_header() -> None:
    assert envoy.served_endpoint(metadata(served="10.0.0.3:8000"), {envoy.SERVED: "x:1"}) == "10.0.0.3:8000"
    assert envoy.served_endpoint(metadata(), {envoy.SERVED: "10.0.0.4:8000"}) == "10.0.0.4:8000"
    assert envoy.served_endpoint(metadata(), {}) is None


def test_route_to_sets_the_header_and_the_metadata_to_one_value() -> None:
    answer = envoy.route_to(["10.0.0.1:8000", "10.0.0.2:8000"], {":path": "/v2/models/m/generate"})
    mutation = answer.request_headers.response.header_mutation
    headers = {option.header.key: option.header.raw_value.decode() for option in mutation.set_headers}
    assert headers == {envoy.DESTINATION: "10.0.0.1:8000,10.0.0.2:8000", ":path": "/v2/models/m/generate"}
    lb = answer.dynamic_metadata.fields[envoy.DESTINATION_NAMESPACE].struct_value.fields[envoy.DESTINATION]
    assert lb.string_value == headers[envoy.DESTINATION]
    assert answer.request_headers.response.clear_route_cache


def test_request_body_is_streamed_in_bounded_chunks() -> None:
    body = bytes(range(256)) * 500  # 128,000 bytes: three chunks of at most 62,000
    answers = envoy.request_body(body)
    streamed = [a.request_body.response.body_mutation.streamed_response for a in answers]
    assert [len(s.body) for s in streamed] == [62_000, 62_000, 4_000]
    assert [s.end_of_stream for s in streamed] == [False, False, True]
    assert b"".join(s.body for s in streamed) == body
    (empty,) = envoy.request_body(b"")
    assert empty.request_body.response.body_mutation.streamed_response.end_of_stream


def test_immediate_answers_carry_status_headers_and_json() -> None:
    answer = envoy.immediate(429, {"error": {"message": "over your share"}}, {"Retry-After": "3"})
    immediate = answer.immediate_response
    headers = {o.header.key: o.header.raw_value.decode() for o in immediate.headers.set_headers}
    assert immediate.status.code == 429 and headers == {"content-type": "application/json", "retry-after": "3"}
    assert json.loads(immediate.body) == {"error": {"message": "over your share"}}


def test_fairness_and_objective_headers_prefer_the_current_names() -> None:
    headers = {"x-gateway-inference-fairness-id": "old", "x-llm-d-inference-fairness-id": "team-a",
               "x-gateway-inference-objective": "chat"}
    assert first_header(headers, FAIRNESS_HEADERS) == "team-a"
    assert first_header(headers, OBJECTIVE_HEADERS) == "chat"  # the alias, when alone


def test_answers_name_the_model_the_client_asked_for() -> None:
    request = GatewayRequest(call=None, path="/", body=b"", client_model="tiny-upper",  # type: ignore[arg-type]
                             upstream_model="tiny", weights_travel=False)
    assert request.client_names(b'{"model":"tiny","x":1}') == b'{"model":"tiny-upper","x":1}'
    assert request.client_names(b'{"model": "tiny"}') == b'{"model": "tiny-upper"}'
    assert request.client_names(b'{"model":"tinyx"}') == b'{"model":"tinyx"}'  # only the whole name
