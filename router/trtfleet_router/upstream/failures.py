"""The upstream side's one error type, and the one place where foreign exceptions become it.

Every transport (gRPC per call, gRPC multiplexed, HTTP) fails with :class:`UpstreamCallFailed`, which
carries a classified :class:`~.protocol.UpstreamFailure`. :func:`failure_of` is the only translation of
third-party exceptions (as httpx maps transport exceptions in one place)::

    grpc.aio.AioRpcError            classify_upstream_error(details, code)  (text first, then the code)
    TimeoutError                    timeout      the request deadline passed (checked before OSError)
    aiohttp.ClientError, OSError    pod_failed   refused, reset or broken connection
    ValueError, RouterError         internal     an answer the router cannot read

Error *answers* of a pod (an error message on the stream, a non-200 status with Triton's error body) are
classified by their text with :func:`~.protocol.classify_upstream_error`, not here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Final

import aiohttp
import grpc

from trtfleet_router.errors import RouterError
from trtfleet_router.upstream.protocol import FailureKind, UpstreamFailure, classify_upstream_error


class UpstreamCallFailed(Exception):
    """An upstream attempt failed; ``failure`` says how."""

    def __init__(self, failure: UpstreamFailure) -> None:
        super().__init__(failure.message)
        self.failure = failure


TRANSLATED: Final = (grpc.aio.AioRpcError, TimeoutError, aiohttp.ClientError, OSError, ValueError, RouterError)


def failure_of(exc: BaseException, where: str) -> UpstreamFailure:
    """The classified failure for a foreign exception raised while talking to ``where`` (a pod address or URL)."""
    if isinstance(exc, UpstreamCallFailed):
        return exc.failure
    if isinstance(exc, grpc.aio.AioRpcError):
        return classify_upstream_error(exc.details() or "", exc.code())
    if isinstance(exc, TimeoutError):  # an OSError too: first
        return UpstreamFailure(FailureKind.TIMEOUT, f"no answer from {where} before the deadline")
    if isinstance(exc, aiohttp.ClientError | OSError):
        return UpstreamFailure(FailureKind.POD_FAILED, f"{where}: {exc}")
    if isinstance(exc, ValueError | RouterError):
        return UpstreamFailure(FailureKind.INTERNAL, f"{where}: bad answer: {exc}")
    raise TypeError(f"no upstream failure for {type(exc).__name__}") from exc


@contextlib.contextmanager
def translated(where: str) -> Iterator[None]:
    """Foreign exceptions raised inside become :class:`UpstreamCallFailed` (``raise ... from``)."""
    try:
        yield
    except UpstreamCallFailed:
        raise
    except TRANSLATED as exc:
        raise UpstreamCallFailed(failure_of(exc, where)) from exc
