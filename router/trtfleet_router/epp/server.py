"""The endpoint-picker port: Envoy's ``ext_proc`` service and gRPC health, served by a router process.

A router started with ``--epp-port`` is also the ``InferencePool``'s endpoint picker: the same fleet view (shared
with the other router replicas), policies, admission and books as its own front ends, reached by a gateway over
``envoy.service.ext_proc.v3.ExternalProcessor/Process`` (one stream per HTTP request, :mod:`.exchange`). gRPC health
answers ``liveness`` (the process answers), ``readiness`` and the ext_proc service (the router has its fleet view and
is not draining); every replica is ready at once, as the view is shared rather than led. The port is served by
:mod:`.wire` (HTTP/2 frames on the router's event loop), not by grpc.aio: the protocol's many small messages cost
several times more CPU through gRPC's core.
"""

from __future__ import annotations

from typing import Final

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from grpc_health.v1 import health_pb2

from trtfleet_router.epp.coldloads import ColdLoads
from trtfleet_router.epp.exchange import Exchange, PickerSettings
from trtfleet_router.epp.wire import CallFailed, GrpcStatus, Method, Stream, WireServer
from trtfleet_router.server.common import Services
from trtfleet_router.upstream.dispatch import Dispatcher
from trtfleet_router.upstream.prewarm import Prewarmer

EXT_PROC_SERVICE: Final = "envoy.service.ext_proc.v3.ExternalProcessor"
PROCESS: Final = f"/{EXT_PROC_SERVICE}/Process"
HEALTH_CHECK: Final = "/grpc.health.v1.Health/Check"
LIVENESS: Final = "liveness"
READINESS: Final = "readiness"


class EndpointPicker:
    def __init__(
        self, services: Services, dispatcher: Dispatcher, prewarmer: Prewarmer, settings: PickerSettings
    ) -> None:
        self.services = services
        self.dispatcher = dispatcher
        self.cold_loads = ColdLoads(prewarmer)
        self.settings = settings

    async def process(self, stream: Stream) -> None:
        await Exchange(self.services, self.dispatcher, self.cold_loads, self.settings, stream).run()


class PickerHealth:
    """The gRPC health service the protocol asks for (``Check``; kubelet's gRPC probes and Envoy's health checks
    call it): ``liveness``, and ``readiness``, the ext_proc service and the server as a whole."""

    def __init__(self) -> None:
        self.statuses: dict[str, int] = {}

    def serving(self, ready: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
        self.statuses[LIVENESS] = health_pb2.HealthCheckResponse.SERVING
        for service in (READINESS, EXT_PROC_SERVICE, ""):
            self.statuses[service] = status

    async def check(self, stream: Stream) -> None:
        request = await stream.read()
        if request is grpc.aio.EOF:
            raise CallFailed(GrpcStatus.INTERNAL, "a health check without its request")
        status = self.statuses.get(request.service)
        if status is None:
            raise CallFailed(GrpcStatus.NOT_FOUND, f"unknown service {request.service!r}")
        await stream.write(health_pb2.HealthCheckResponse(status=status))


def build_picker_server(picker: EndpointPicker, picker_health: PickerHealth, max_message_bytes: int) -> WireServer:
    return WireServer(
        {
            PROCESS: Method(ext_proc.ProcessingRequest.FromString, picker.process),
            HEALTH_CHECK: Method(health_pb2.HealthCheckRequest.FromString, picker_health.check),
        },
        max_message_bytes,
    )
