"""Bad input is answered 4xx with the front end's own error body, before any pod sees it, and never
counts against a pod (echo upstreams behind a real router; real HTTP clients)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.unit.router.harness import EchoFleet


@pytest.fixture(scope="module")
def echo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EchoFleet]:
    fleet = EchoFleet(tmp_path_factory.mktemp("bad-input"), count=2)
    try:
        yield fleet
    finally:
        fleet.close()


def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@dataclass(frozen=True)
class Case:
    path: str
    body: dict[str, Any]
    status: int
    says: str


OPENAI_CASES = [
    pytest.param(
        Case("/v1/completions", {"model": "a1", "prompt": "x", "max_tokens": 4, "seed": -1}, 400, "'seed'"),
        id="completions seed -1",
    ),
    pytest.param(
        Case(
            "/v1/chat/completions",
            {"model": "a1", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4, "seed": -1},
            400,
            "'seed'",
        ),
        id="chat seed -1",
    ),
    pytest.param(
        Case("/v1/completions", {"model": "a1", "prompt": "x", "max_tokens": 4, "seed": 2**64}, 400, "'seed'"),
        id="seed above uint64",
    ),
]

TRITON_CASES = [
    pytest.param(
        Case("/v2/models/a1/generate", {"text_input": "x"}, 400, "missing required input 'max_tokens'"),
        id="generate without max_tokens",
    ),
    pytest.param(
        Case("/v2/models/tiny/generate_stream", {"max_tokens": 4}, 400, "missing required input 'text_input'"),
        id="generate_stream without text_input",
    ),
    pytest.param(
        Case(
            "/v2/models/a1/infer",
            {
                "inputs": [
                    {"name": "text_input", "datatype": "BYTES", "shape": [1, 1], "data": ["x"]},
                    {"name": "max_tokens", "datatype": "INT32", "shape": [1, 1], "data": [4]},
                ],
                "outputs": [{"name": "no_such_output"}],
            },
            400,
            "unknown output 'no_such_output'",
        ),
        id="infer asking for an unknown output",
    ),
    pytest.param(
        Case("/v2/models/a1/generate", {"text_input": "x", "max_tokens": 4, "parameters": {"p": 2**63}}, 400, "64-bit"),
        id="parameter beyond int64",
    ),
]


@pytest.mark.parametrize("case", OPENAI_CASES)
def test_openai_bad_input(echo: EchoFleet, case: Case) -> None:
    before = sum(u.stats.requests for u in echo.upstreams)
    status, body = post(echo.router.http_url + case.path, case.body)
    assert status == case.status
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert case.says in error["message"]
    assert sum(u.stats.requests for u in echo.upstreams) == before  # no pod saw it
    assert echo.router.router.fleets.ejected("tiny") == frozenset()


@pytest.mark.parametrize("case", TRITON_CASES)
def test_triton_bad_input(echo: EchoFleet, case: Case) -> None:
    before = sum(u.stats.requests for u in echo.upstreams)
    status, body = post(echo.router.http_url + case.path, case.body)
    assert status == case.status
    assert set(body) == {"error"} and case.says in body["error"]
    assert sum(u.stats.requests for u in echo.upstreams) == before
    assert echo.router.router.fleets.ejected("tiny") == frozenset()


def test_integer_parameters_pass(echo: EchoFleet) -> None:
    body = {"text_input": "hi", "max_tokens": 8, "parameters": {"priority": 2, "offset": -3}}
    status, answer = post(echo.router.http_url + "/v2/models/a1/generate", body)
    assert status == 200 and answer["text_output"] == "[101] hi"


def test_seed_zero_and_the_largest_pass(echo: EchoFleet) -> None:
    for seed in (0, 2**64 - 1):
        status, _ = post(
            echo.router.http_url + "/v1/completions", {"model": "a1", "prompt": "x", "max_tokens": 4, "seed": seed}
        )
        assert status == 200
