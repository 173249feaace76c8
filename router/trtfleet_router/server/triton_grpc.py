"""The Triton-compatible gRPC front end (``inference.GRPCInferenceService``, tritonclient's stubs).

ServerLive/Ready, ServerMetadata, ModelReady, ModelMetadata, ModelConfig, ModelInfer and
ModelStreamInfer, with served names as model names (see :mod:`.triton_http`). ModelInfer collects a
streamed upstream answer into one response (:func:`~.triton_protocol.merge_responses`).

ModelStreamInfer runs every request of a client stream concurrently; responses carry the client's
request ``id`` and model name. Final-response flags: a request with the
``triton_enable_empty_final_response`` parameter gets its responses as they come plus an empty one
with ``triton_final_response: true``; without it, each response is held until the next arrives so
that the last one can carry ``triton_final_response: true`` (one response of delay; set the
parameter, as ``tritonclient``'s ``enable_empty_final_response=True`` does, to stream without it).
Errors before a request's first response end the RPC for unary calls (status codes from
:mod:`trtfleet_router.errors`) and arrive as ``error_message`` responses inside streams.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any, NoReturn

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from trtfleet import version
from trtfleet_router.errors import RetryableError, RouterError, mapping_for
from trtfleet_router.server.auth import presented_key
from trtfleet_router.server.common import RequestRecord, Services
from trtfleet_router.server.tensor_calls import prepare_tensor_call, travel_as_generate_json
from trtfleet_router.server.triton_http import EXTENSIONS, SERVER_NAME
from trtfleet_router.server.triton_models import renamed_config, renamed_metadata
from trtfleet_router.server.triton_protocol import merge_responses
from trtfleet_router.upstream.protocol import EMPTY_FINAL_PARAM, FINAL_RESPONSE_PARAM

FRONTEND = "triton_grpc"


def _api_key(context: grpc.aio.ServicerContext[Any, Any]) -> str | None:
    metadata = {key.lower(): value for key, value in context.invocation_metadata() or ()}
    return presented_key({k: v for k, v in metadata.items() if isinstance(v, str)})


def _api_key_if_used(services: Services, context: grpc.aio.ServicerContext[Any, Any]) -> str | None:
    """The client's key when keys are on (``--api-keys``); inference calls skip the metadata otherwise."""
    return None if services.api_keys is None else _api_key(context)


async def _abort(context: grpc.aio.ServicerContext[Any, Any], error: RouterError) -> NoReturn:
    if isinstance(error, RetryableError):
        context.set_trailing_metadata((("retry-after", str(error.retry_after_s)),))
    await context.abort(mapping_for(error).grpc_code, error.message)
    raise AssertionError("context.abort returned")  # pragma: no cover


def _final_marker(response: service_pb2.ModelInferResponse, final: bool) -> service_pb2.ModelStreamInferResponse:
    response.parameters[FINAL_RESPONSE_PARAM].bool_param = final
    return service_pb2.ModelStreamInferResponse(infer_response=response)


class TritonGrpcFrontend(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    def __init__(self, services: Services) -> None:
        self.services = services

    async def ServerLive(self, request: Any, context: Any) -> service_pb2.ServerLiveResponse:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> service_pb2.ServerReadyResponse:
        fleets = self.services.fleets
        ready = not self.services.lifecycle.draining and any(
            fleets.ready_endpoints(name) for name in fleets.registry.bases
        )
        return service_pb2.ServerReadyResponse(ready=ready)

    async def ServerMetadata(self, request: Any, context: Any) -> service_pb2.ServerMetadataResponse:
        return service_pb2.ServerMetadataResponse(name=SERVER_NAME, version=version.__version__, extensions=EXTENSIONS)

    async def ModelReady(self, request: service_pb2.ModelReadyRequest, context: Any) -> service_pb2.ModelReadyResponse:
        try:
            target = self.services.resolve(request.name, _api_key(context))
        except RouterError as exc:
            await _abort(context, exc)
        ready = not self.services.lifecycle.draining and bool(self.services.fleets.ready_endpoints(target.base.name))
        return service_pb2.ModelReadyResponse(ready=ready)

    async def ModelMetadata(
        self, request: service_pb2.ModelMetadataRequest, context: Any
    ) -> service_pb2.ModelMetadataResponse:
        try:
            target = self.services.resolve(request.name, _api_key(context))
            metadata = await self.services.model_info.metadata(target.base)
        except RouterError as exc:
            await _abort(context, exc)
        return renamed_metadata(metadata, request.name)

    async def ModelConfig(
        self, request: service_pb2.ModelConfigRequest, context: Any
    ) -> service_pb2.ModelConfigResponse:
        try:
            target = self.services.resolve(request.name, _api_key(context))
            config = await self.services.model_info.config(target.base)
        except RouterError as exc:
            await _abort(context, exc)
        return service_pb2.ModelConfigResponse(config=renamed_config(config, request.name))

    async def ModelInfer(self, request: service_pb2.ModelInferRequest, context: Any) -> service_pb2.ModelInferResponse:
        services = self.services
        name, client_id = request.model_name, request.id
        request_id = services.request_ids.new(client_id or None)
        try:
            with services.track(FRONTEND, request_id) as record:
                responses = [
                    r async for r in self._responses(request, _api_key_if_used(services, context), record, False)
                ]
        except RouterError as exc:
            await _abort(context, exc)
        merged = merge_responses(responses)
        merged.model_name, merged.id = name, client_id
        return merged

    async def _responses(
        self, request: service_pb2.ModelInferRequest, api_key: str | None, record: RequestRecord, streaming: bool
    ) -> AsyncGenerator[service_pb2.ModelInferResponse, None]:
        name, client_id = request.model_name, request.id
        if self.services.api_keys is not None:  # the key's own body limit (the server's bounds every message)
            self.services.check_message_size(api_key, request.ByteSize())
        target, call = await prepare_tensor_call(
            self.services, request, name, api_key, record.request_id, client_streaming=streaming
        )
        record.model_kind, record.model = target.model_kind, name
        await travel_as_generate_json(self.services, target, call, streaming=streaming)
        async with aclosing(self.services.dispatcher.stream(call)) as stream:
            async for response in stream:
                if record.first_output_s is None:
                    record.first_output_s = time.perf_counter()
                response.model_name, response.id = name, client_id
                yield response

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[service_pb2.ModelInferRequest], context: Any
    ) -> AsyncIterator[service_pb2.ModelStreamInferResponse]:
        api_key = _api_key_if_used(self.services, context)
        queue: asyncio.Queue[service_pb2.ModelStreamInferResponse | None] = asyncio.Queue()
        tasks: set[asyncio.Task[None]] = set()

        async def read_requests() -> None:
            async for request in request_iterator:
                task = asyncio.create_task(self._stream_one(request, api_key, queue))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            while tasks:
                await asyncio.gather(*list(tasks), return_exceptions=True)
            queue.put_nowait(None)

        reader = asyncio.create_task(read_requests())
        try:
            while True:
                item = await queue.get()
                if item is None:
                    break
                yield item
            await reader
        finally:
            reader.cancel()
            for task in list(tasks):
                task.cancel()

    async def _stream_one(
        self,
        request: service_pb2.ModelInferRequest,
        api_key: str | None,
        queue: asyncio.Queue[service_pb2.ModelStreamInferResponse | None],
    ) -> None:
        services = self.services
        name, client_id = request.model_name, request.id
        empty_final = (
            request.parameters[EMPTY_FINAL_PARAM].bool_param if EMPTY_FINAL_PARAM in request.parameters else False
        )
        held: service_pb2.ModelInferResponse | None = None
        try:
            with services.track(FRONTEND, services.request_ids.new(client_id or None)) as record:
                async with aclosing(self._responses(request, api_key, record, True)) as responses:
                    async for response in responses:
                        if empty_final:
                            queue.put_nowait(_final_marker(response, False))
                            continue
                        if held is not None:
                            queue.put_nowait(_final_marker(held, False))
                        held = response
        except RouterError as exc:
            if held is not None:
                queue.put_nowait(_final_marker(held, False))
            error = service_pb2.ModelInferResponse(model_name=name, id=client_id)
            queue.put_nowait(service_pb2.ModelStreamInferResponse(error_message=exc.message, infer_response=error))
            return
        if empty_final:
            queue.put_nowait(_final_marker(service_pb2.ModelInferResponse(model_name=name, id=client_id), True))
        elif held is not None:
            queue.put_nowait(_final_marker(held, True))
        else:
            queue.put_nowait(_final_marker(service_pb2.ModelInferResponse(model_name=name, id=client_id), True))


def build_grpc_server(services: Services, *, max_message_bytes: int) -> grpc.aio.Server:
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", -1),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
        ]
    )
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(TritonGrpcFrontend(services), server)
    return server
