"""The error tree's one mapping table: HTTP status, gRPC code, OpenAI type, Retry-After."""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from trtfleet_router import errors as e
from trtfleet_router.app import guarded

CASES = [
    (e.RouterError("x"), 500, grpc.StatusCode.INTERNAL, "server_error"),
    (e.MalformedRequest("x"), 400, grpc.StatusCode.INVALID_ARGUMENT, "invalid_request_error"),
    (e.UnsupportedParameter("x"), 400, grpc.StatusCode.INVALID_ARGUMENT, "invalid_request_error"),
    (e.LimitExceeded("x"), 400, grpc.StatusCode.INVALID_ARGUMENT, "invalid_request_error"),
    (e.OpenAIOnly("x"), 400, grpc.StatusCode.INVALID_ARGUMENT, "invalid_request_error"),
    (e.BodyTooLarge("x"), 413, grpc.StatusCode.INVALID_ARGUMENT, "invalid_request_error"),
    (e.RequestTimeout("x"), 408, grpc.StatusCode.DEADLINE_EXCEEDED, "invalid_request_error"),
    (e.Unauthenticated("x"), 401, grpc.StatusCode.UNAUTHENTICATED, "authentication_error"),
    (e.PermissionDenied("x"), 403, grpc.StatusCode.PERMISSION_DENIED, "permission_error"),
    (e.ModelNotFound("x"), 404, grpc.StatusCode.NOT_FOUND, "not_found_error"),
    (e.ObjectNotFound("x"), 404, grpc.StatusCode.NOT_FOUND, "invalid_request_error"),
    (e.Overloaded("x"), 429, grpc.StatusCode.RESOURCE_EXHAUSTED, "rate_limit_error"),
    (e.Shed("x"), 429, grpc.StatusCode.RESOURCE_EXHAUSTED, "rate_limit_error"),
    (e.Unavailable("x"), 503, grpc.StatusCode.UNAVAILABLE, "service_unavailable"),
    (e.NoCapacityAvailable("x"), 503, grpc.StatusCode.UNAVAILABLE, "service_unavailable"),
    (e.ShuttingDown("x"), 503, grpc.StatusCode.UNAVAILABLE, "service_unavailable"),
    (e.UpstreamRejected("x"), 400, grpc.StatusCode.INVALID_ARGUMENT, "invalid_request_error"),
    (e.UpstreamFailed("x"), 502, grpc.StatusCode.INTERNAL, "upstream_error"),
    (e.StreamInterrupted("x"), 502, grpc.StatusCode.INTERNAL, "upstream_error"),
    (e.UpstreamTimeout("x"), 504, grpc.StatusCode.DEADLINE_EXCEEDED, "timeout_error"),
    (e.WeightsUnavailable("x"), 502, grpc.StatusCode.INTERNAL, "upstream_error"),
    (e.AdapterUnservable("x"), 500, grpc.StatusCode.INTERNAL, "server_error"),
]


@pytest.mark.parametrize(("error", "status", "code", "kind"), CASES, ids=lambda v: type(v).__name__)
def test_mapping(error: e.RouterError, status: int, code: grpc.StatusCode, kind: str) -> None:
    mapping = e.mapping_for(error)
    assert (mapping.http_status, mapping.grpc_code, mapping.openai_type) == (status, code, kind)


def test_every_error_class_is_covered() -> None:
    classes = {cls for cls in vars(e).values() if isinstance(cls, type) and issubclass(cls, e.RouterError)}
    assert classes - {type(error) for error, *_ in CASES} == {e.RetryableError, e.RequestError}


def test_openai_body_shape() -> None:
    body = e.openai_error_body(e.ModelNotFound("no such model", param="model", code="model_not_found"))
    assert body == {
        "error": {"message": "no such model", "type": "not_found_error", "param": "model", "code": "model_not_found"}
    }
    assert e.openai_error_body(e.LimitExceeded("long"))["error"]["code"] == "limit"


def test_retry_after_only_for_retryable() -> None:
    assert e.http_headers_for(e.Overloaded("busy", retry_after_s=3)) == {"Retry-After": "3"}
    assert e.http_headers_for(e.NoCapacityAvailable("none")) == {"Retry-After": "1"}
    assert e.http_headers_for(e.ModelNotFound("x")) == {}
    assert e.triton_error_body(e.ModelNotFound("gone")) == {"error": "gone"}


def test_unexpected_exceptions_become_a_logged_500_and_http_errors_pass(caplog: pytest.LogCaptureFixture) -> None:
    async def broken(request: web.Request) -> web.StreamResponse:
        raise KeyError("a bug")

    async def missing(request: web.Request) -> web.StreamResponse:
        raise web.HTTPNotFound()

    async def scenario() -> None:
        app = web.Application()
        app.add_routes(
            guarded([web.get("/broken", broken), web.get("/v2/broken", broken), web.get("/missing", missing)])
        )
        async with TestClient(TestServer(app)) as client:
            response = await client.get("/broken")
            assert response.status == 500
            assert (await response.json())["error"] == {
                "message": "internal error",
                "type": "server_error",
                "param": None,
                "code": "internal",
            }
            triton = await client.get("/v2/broken")  # Triton routes answer in Triton's format
            assert triton.status == 500 and await triton.json() == {"error": "internal error"}
            assert (await client.get("/missing")).status == 404

    with caplog.at_level(logging.ERROR, logger="trtfleet_router.app"):
        asyncio.run(scenario())
    assert any(record.message == "unhandled error" and record.exc_info for record in caplog.records)
