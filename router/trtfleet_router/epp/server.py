"""The endpoint-picker port: Envoy's ``ext_proc`` service and gRPC health, served by a router process.

A router started with ``--epp-port`` is also the ``InferencePool``'s endpoint picker: the same fleet view (shared
with the other router replicas), policies, admission and books as its own front ends, reached by a gateway over
``envoy.service.ext_proc.v3.ExternalProcessor/Process`` (one stream per HTTP request, :mod:`.exchange`). gRPC health
answers ``liveness`` (the process answers), ``readiness`` and the ext_proc service (the router has its fleet view and
is not draining); every replica is ready at once, as the view is shared rather than led.
"""

from __future__ import annotations

from typing import Any, Final

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from trtfleet_router.epp.coldloads import ColdLoads
from trtfleet_router.epp.exchange import Exchange, PickerSettings
from trtfleet_router.server.common import Services
from trtfleet_router.upstream.dispatch import Dispatcher
from trtfleet_router.upstream.prewarm import Prewarmer

EXT_PROC_SERVICE: Final = "envoy.service.ext_proc.v3.ExternalProcessor"
LIVENESS: Final = "liveness"
READINESS: Final = "readiness"


class EndpointPicker(ext_proc_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(
        self, services: Services, dispatcher: Dispatcher, prewarmer: Prewarmer, settings: PickerSettings
    ) -> None:
        self.services = services
        self.dispatcher = dispatcher
        self.cold_loads = ColdLoads(prewarmer)
        self.settings = settings

    async def Process(self, request_iterator: Any, context: Any) -> None:
        await Exchange(self.services, self.dispatcher, self.cold_loads, self.settings, context).run()


class PickerHealth:
    """The gRPC health services the protocol asks for."""

    def __init__(self) -> None:
        self.servicer = health.aio.HealthServicer()

    async def serving(self, ready: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
        await self.servicer.set(LIVENESS, health_pb2.HealthCheckResponse.SERVING)
        for service in (READINESS, EXT_PROC_SERVICE, ""):
            await self.servicer.set(service, status)


def build_picker_server(picker: EndpointPicker, picker_health: PickerHealth) -> grpc.aio.Server:
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)])
    ext_proc_grpc.add_ExternalProcessorServicer_to_server(picker, server)
    health_pb2_grpc.add_HealthServicer_to_server(picker_health.servicer, server)
    return server
