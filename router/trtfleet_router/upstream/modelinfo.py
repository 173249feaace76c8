"""The upstream model's config and metadata, read once from a ready pod and cached per base model.

The text path needs the upstream model's declared inputs (which optional knobs it takes, whether it
batches); the Triton front ends serve its config and metadata under the base model's or adapter's
name. A pod that cannot be asked yet yields the defaults of NVIDIA's BLS model for the text path
(retried after ``retry_after_s``) and 503 for config/metadata requests.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, TypeVar

import grpc
from tritonclient.grpc import model_config_pb2, service_pb2

from trtfleet_router.errors import NoCapacityAvailable, OpenAIOnly
from trtfleet_router.liveview import FleetSet
from trtfleet_router.models_registry import BaseModelEntry
from trtfleet_router.upstream.pool import ChannelPool
from trtfleet_router.upstream.protocol import UpstreamModelInfo

log = logging.getLogger(__name__)

FETCH_TIMEOUT_S: Final = 5.0
RETRY_AFTER_S: Final = 5.0

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _Fetched:
    config: model_config_pb2.ModelConfig
    metadata: service_pb2.ModelMetadataResponse
    info: UpstreamModelInfo


class ModelInfoCache:
    def __init__(self, pool: ChannelPool, fleets: FleetSet, *, now: Callable[[], float] = time.monotonic) -> None:
        self._pool = pool
        self._fleets = fleets
        self._now = now
        self._fetched: dict[tuple[str, str], _Fetched] = {}
        self._defaults: dict[tuple[str, str], tuple[UpstreamModelInfo, float]] = {}
        self._pending: dict[tuple[str, str], asyncio.Task[_Fetched]] = {}

    async def info(self, base: BaseModelEntry) -> UpstreamModelInfo:
        """The upstream model's inputs (hot path: a dict lookup once fetched)."""
        key = (base.name, base.upstream_model)
        fetched = self._fetched.get(key)
        if fetched is not None:
            return fetched.info
        default = self._defaults.get(key)
        if default is not None and self._now() < default[1]:
            return default[0]
        try:
            return (await self._fetch(base)).info
        except NoCapacityAvailable:
            info = UpstreamModelInfo(name=base.upstream_model)
            self._defaults[key] = (info, self._now() + RETRY_AFTER_S)
            return info

    async def config(self, base: BaseModelEntry) -> model_config_pb2.ModelConfig:
        return (await self._fetch(base)).config

    async def metadata(self, base: BaseModelEntry) -> service_pb2.ModelMetadataResponse:
        return (await self._fetch(base)).metadata

    async def _fetch(self, base: BaseModelEntry) -> _Fetched:
        if base.serves_openai:
            raise OpenAIOnly(
                f"base model '{base.name}' runs trtllm-serve (runtime pytorch), which has no Triton model: "
                "use the OpenAI API (/v1/completions, /v1/chat/completions)",
                param="model",
                code="openai_api_only",
            )
        if base.serves_llmapi:  # its tensors (text_input, sampling_param_*, lora_id/name/path) are not the BLS's
            raise OpenAIOnly(
                f"base model '{base.name}' runs Triton with TRT-LLM's llmapi model (runtime pytorch), whose "
                "tensors the router does not pass through: use the OpenAI API (/v1/completions, "
                "/v1/chat/completions)",
                param="model",
                code="openai_api_only",
            )
        key = (base.name, base.upstream_model)
        fetched = self._fetched.get(key)
        if fetched is not None:
            return fetched
        task = self._pending.get(key)
        if task is None:
            task = asyncio.create_task(self._ask_pods(base))
            self._pending[key] = task
            task.add_done_callback(lambda done: self._done(key, done))
        return await asyncio.shield(task)

    def _done(self, key: tuple[str, str], task: asyncio.Task[_Fetched]) -> None:
        self._pending.pop(key, None)
        if task.cancelled() or task.exception() is not None:
            return
        self._fetched[key] = task.result()
        self._defaults.pop(key, None)

    async def _ask_pods(self, base: BaseModelEntry) -> _Fetched:
        errors = []
        for endpoint in self._fleets.ready_endpoints(base.name):
            stub = self._pool.stub(endpoint.address)
            try:
                config = await _call(
                    stub.ModelConfig(service_pb2.ModelConfigRequest(name=base.upstream_model), timeout=FETCH_TIMEOUT_S)
                )
                metadata = await _call(
                    stub.ModelMetadata(
                        service_pb2.ModelMetadataRequest(name=base.upstream_model), timeout=FETCH_TIMEOUT_S
                    )
                )
            except grpc.aio.AioRpcError as exc:
                errors.append(f"{endpoint.pod_id}: {exc.code().name} {exc.details()}")
                continue
            info = UpstreamModelInfo.from_config(config.config)
            log.info(
                "upstream model config read",
                extra={
                    "ctx": {
                        "base_model": base.name,
                        "upstream_model": base.upstream_model,
                        "pod": endpoint.pod_id,
                        "inputs": len(info.inputs),
                        "decoupled": info.decoupled,
                    }
                },
            )
            return _Fetched(config.config, metadata, info)
        detail = "; ".join(errors) if errors else "no ready pod"
        raise NoCapacityAvailable(
            f"cannot read the config of '{base.upstream_model}' for base model '{base.name}': {detail}"
        )

    def forget(self, base_model: str) -> None:
        for key in [k for k in self._fetched if k[0] == base_model]:
            del self._fetched[key]


async def _call(awaitable: Awaitable[T]) -> T:
    return await awaitable
