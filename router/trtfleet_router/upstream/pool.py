"""One pooled grpc.aio channel per pod address, with HTTP/2 keep-alive and no message size limit.

Channels are created on first use and closed when discovery no longer lists their address
(:meth:`ChannelPool.retain`). A channel multiplexes every concurrent call to its pod.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Final

import grpc
from tritonclient.grpc import service_pb2_grpc

log = logging.getLogger(__name__)

KEEPALIVE_TIME_MS: Final = 300_000
"""Triton's gRPC server answers pings more frequent than 5 min without data with GOAWAY too_many_pings
(``--grpc-http2-min-recv-ping-interval-without-data`` default); request deadlines catch dead pods sooner."""
KEEPALIVE_TIMEOUT_MS: Final = 20_000
UNLIMITED: Final = -1
REMOVED_POD_GRACE_S: Final = 30.0
"""In-flight calls to a pod discovery dropped may finish within this long (a draining pod)."""

CHANNEL_OPTIONS: Final = (
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.max_send_message_length", UNLIMITED),  # LoRA weights travel inside requests
    ("grpc.max_receive_message_length", UNLIMITED),
    ("grpc.enable_retries", 0),  # the dispatcher decides about retries
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
)


class ChannelPool:
    def __init__(self) -> None:
        self._channels: dict[str, tuple[grpc.aio.Channel, service_pb2_grpc.GRPCInferenceServiceStub]] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def stub(self, address: str) -> service_pb2_grpc.GRPCInferenceServiceStub:
        entry = self._channels.get(address)
        if entry is None:
            channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
            entry = (channel, service_pb2_grpc.GRPCInferenceServiceStub(channel))
            self._channels[address] = entry
            log.info("upstream channel opened", extra={"ctx": {"address": address}})
        return entry[1]

    def retain(self, addresses: Iterable[str], grace_s: float | None = REMOVED_POD_GRACE_S) -> None:
        """Close (in the background, after ``grace_s``) the channels of addresses not in ``addresses``."""
        keep = set(addresses)
        for address in [a for a in self._channels if a not in keep]:
            channel, _ = self._channels.pop(address)
            task = asyncio.create_task(channel.close(grace=grace_s))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
            log.info("upstream channel closing", extra={"ctx": {"address": address}})

    async def close(self) -> None:
        """Close every channel now (in-flight calls are cancelled)."""
        self.retain((), grace_s=None)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
