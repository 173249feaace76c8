"""The router's error tree, and the one table that maps it onto HTTP, gRPC and OpenAI error bodies.

Every failure the router reports to a client is a :class:`RouterError`; third-party exceptions
(aiohttp, grpc, numpy, pydantic) are translated at the boundary with ``raise ... from exc``.
``ERROR_MAPPINGS`` below is the only place where an error becomes a status code::

    RouterError                      500 INTERNAL            server_error
    ├── RequestError                 400 INVALID_ARGUMENT    invalid_request_error
    │   ├── MalformedRequest         400 INVALID_ARGUMENT    (bad JSON, wrong types, bad tensors)
    │   ├── UnsupportedParameter     400 INVALID_ARGUMENT    (n > 1, logprobs, ...)
    │   └── LimitExceeded            400 INVALID_ARGUMENT    (prompt / max_tokens above the engine limits)
    ├── BodyTooLarge                 413 INVALID_ARGUMENT    invalid_request_error
    ├── RequestTimeout               408 DEADLINE_EXCEEDED   invalid_request_error (body not sent in time)
    ├── Unauthenticated              401 UNAUTHENTICATED     authentication_error
    ├── PermissionDenied             403 PERMISSION_DENIED   permission_error
    ├── ModelNotFound                404 NOT_FOUND           not_found_error
    ├── ObjectNotFound               404 NOT_FOUND           invalid_request_error (no such file / batch)
    ├── Overloaded                   429 RESOURCE_EXHAUSTED  rate_limit_error   (+ Retry-After)
    │   └── Shed                     429 RESOURCE_EXHAUSTED  (a saturated fleet turned it away: code
    │                                                         tenant_over_share, priority_shed or saturated)
    ├── Unavailable                  503 UNAVAILABLE         service_unavailable (+ Retry-After)
    │   ├── NoCapacityAvailable      503 UNAVAILABLE         (no ready pod for the model)
    │   └── ShuttingDown             503 UNAVAILABLE
    ├── UpstreamRejected             400 INVALID_ARGUMENT    invalid_request_error (pod refused inputs)
    ├── UpstreamFailed               502 INTERNAL            upstream_error
    │   └── StreamInterrupted        502 INTERNAL            (a started stream broke; never retried)
    ├── UpstreamTimeout              504 DEADLINE_EXCEEDED   timeout_error
    ├── AdapterUnservable            500 INTERNAL            server_error (no pod's LoRA cache can hold it)
    └── WeightsUnavailable           502 INTERNAL            upstream_error (missing / bad sha256)

Upstream error *texts* (TRT-LLM's miss, cache-full and queue-full messages) are classified by
:func:`trtfleet_router.upstream.protocol.classify_upstream_error`; only what survives the retry logic
becomes one of the errors above.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import grpc

RETRY_AFTER_S_DEFAULT: Final = 1


class RouterError(Exception):
    """Root of every error the router reports to a client."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class RequestError(RouterError):
    """The request is invalid."""


class MalformedRequest(RequestError):
    """The body is not valid JSON / protobuf, or a field has the wrong type."""


class UnsupportedParameter(RequestError):
    """A parameter the router (or the engine) does not support."""


class OpenAIOnly(RequestError):
    """A Triton tensor call for a base model whose pods run trtllm-serve (runtime ``pytorch``)."""


class LimitExceeded(RequestError):
    """The prompt or ``max_tokens`` exceed the engine's build limits."""


class BodyTooLarge(RouterError):
    """The request body exceeds ``--max-body-bytes``."""


class RequestTimeout(RouterError):
    """The request body did not arrive within the body timeout (the connection is then closed)."""


class Unauthenticated(RouterError):
    """No or an unknown API key."""


class PermissionDenied(RouterError):
    """The API key may not use this model."""


class ModelNotFound(RouterError):
    """No base model or adapter is served under this name."""


class ObjectNotFound(RouterError):
    """No file or batch with this id (OpenAI answers 404 with ``invalid_request_error``)."""


class RetryableError(RouterError):
    """Errors the client may retry later; carry ``retry_after_s`` for the ``Retry-After`` header."""

    def __init__(self, message: str, *, retry_after_s: int = RETRY_AFTER_S_DEFAULT, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.retry_after_s = retry_after_s


class Overloaded(RetryableError):
    """Every candidate pod pushed back (queue full or LoRA cache full)."""


class Shed(Overloaded):
    """The base model's fleet is saturated and this request was turned away (or pushed out of the line): its tenant
    is over its share (``code`` ``tenant_over_share``), its band is shed first (``priority_shed``), or the wait it
    would face exceeds what it may wait (``saturated``)."""


class Unavailable(RetryableError):
    """The router cannot serve the model right now."""


class NoCapacityAvailable(Unavailable):
    """No ready pod serves the base model (or all were excluded after failures)."""


class ShuttingDown(Unavailable):
    """The router is draining after SIGTERM."""


class UpstreamRejected(RouterError):
    """A pod refused the request as invalid (gRPC INVALID_ARGUMENT / a validation error text)."""


class UpstreamFailed(RouterError):
    """A pod failed and no retry was possible or left."""


class StreamInterrupted(UpstreamFailed):
    """A stream that had already sent tokens to the client broke; it is ended with this error."""


class UpstreamTimeout(RouterError):
    """The pod did not answer within the request deadline."""


class AdapterUnservable(RouterError):
    """The adapter needs more LoRA cache pages than any pod has: a fleet configuration error."""


class WeightsUnavailable(RouterError):
    """The adapter's converted weights could not be loaded or failed their sha256 check."""


@dataclass(frozen=True, slots=True)
class ErrorMapping:
    http_status: int
    grpc_code: grpc.StatusCode
    openai_type: str
    code_label: str
    """Short, bounded label for logs and the ``code`` label of ``trtfleet_router_requests_total``."""


ERROR_MAPPINGS: Final[dict[type[RouterError], ErrorMapping]] = {
    RouterError: ErrorMapping(500, grpc.StatusCode.INTERNAL, "server_error", "internal"),
    RequestError: ErrorMapping(400, grpc.StatusCode.INVALID_ARGUMENT, "invalid_request_error", "bad_request"),
    LimitExceeded: ErrorMapping(400, grpc.StatusCode.INVALID_ARGUMENT, "invalid_request_error", "limit"),
    BodyTooLarge: ErrorMapping(413, grpc.StatusCode.INVALID_ARGUMENT, "invalid_request_error", "too_large"),
    RequestTimeout: ErrorMapping(408, grpc.StatusCode.DEADLINE_EXCEEDED, "invalid_request_error", "body_timeout"),
    Unauthenticated: ErrorMapping(401, grpc.StatusCode.UNAUTHENTICATED, "authentication_error", "unauth"),
    PermissionDenied: ErrorMapping(403, grpc.StatusCode.PERMISSION_DENIED, "permission_error", "forbidden"),
    ModelNotFound: ErrorMapping(404, grpc.StatusCode.NOT_FOUND, "not_found_error", "not_found"),
    ObjectNotFound: ErrorMapping(404, grpc.StatusCode.NOT_FOUND, "invalid_request_error", "no_object"),
    Overloaded: ErrorMapping(429, grpc.StatusCode.RESOURCE_EXHAUSTED, "rate_limit_error", "overloaded"),
    Shed: ErrorMapping(429, grpc.StatusCode.RESOURCE_EXHAUSTED, "rate_limit_error", "shed"),
    Unavailable: ErrorMapping(503, grpc.StatusCode.UNAVAILABLE, "service_unavailable", "unavailable"),
    UpstreamRejected: ErrorMapping(400, grpc.StatusCode.INVALID_ARGUMENT, "invalid_request_error", "rejected"),
    UpstreamFailed: ErrorMapping(502, grpc.StatusCode.INTERNAL, "upstream_error", "upstream"),
    StreamInterrupted: ErrorMapping(502, grpc.StatusCode.INTERNAL, "upstream_error", "interrupted"),
    UpstreamTimeout: ErrorMapping(504, grpc.StatusCode.DEADLINE_EXCEEDED, "timeout_error", "timeout"),
    WeightsUnavailable: ErrorMapping(502, grpc.StatusCode.INTERNAL, "upstream_error", "weights"),
    AdapterUnservable: ErrorMapping(500, grpc.StatusCode.INTERNAL, "server_error", "adapter_too_large"),
}


def mapping_for(error: RouterError) -> ErrorMapping:
    """The mapping of ``error``'s most specific class in :data:`ERROR_MAPPINGS`."""
    for cls in type(error).__mro__:
        found = ERROR_MAPPINGS.get(cls)
        if found is not None:
            return found
    return ERROR_MAPPINGS[RouterError]


def http_headers_for(error: RouterError) -> dict[str, str]:
    """Extra response headers: ``Retry-After`` for retryable errors."""
    if isinstance(error, RetryableError):
        return {"Retry-After": str(error.retry_after_s)}
    return {}


def openai_error_body(error: RouterError) -> dict[str, Any]:
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    mapping = mapping_for(error)
    return {
        "error": {
            "message": error.message,
            "type": mapping.openai_type,
            "param": error.param,
            "code": error.code if error.code is not None else mapping.code_label,
        }
    }


def triton_error_body(error: RouterError) -> dict[str, Any]:
    """Triton's HTTP error body: ``{"error": "<message>"}``."""
    return {"error": error.message}
