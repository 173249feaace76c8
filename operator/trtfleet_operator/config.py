"""The operator's configuration: flags and environment, parsed once into frozen dataclasses.

Images of operator-owned pods come from the environment (the Helm chart sets them):

``TRTFLEET_IMAGE``           converts adapters and stages ``runtime: pytorch`` checkpoints; its
                             ``/opt/trtfleet/cli`` (:mod:`trtfleet.clibundle`) is copied by an init container
                             into the pods that run NVIDIA's stock images and need the ``trtfleet`` command
                             (engine builds, quantizing prepares); default ``ghcr.io/trtfleet/trtfleet:<version>``.
``TRTFLEET_WORKER_IMAGE``    serves ``runtime: reference`` BaseModels (``trtfleet worker``) and converts
                             their adapters (the sample adapters ship in it); default
                             ``ghcr.io/trtfleet/reference-worker:<version>``.
``TRTFLEET_MODELOPT_IMAGE``  optional: a TensorRT-LLM image that also carries NVIDIA ModelOpt's
                             ``examples/llm_ptq`` (images/modelopt.Dockerfile); quantizing prepares of
                             ``runtime: pytorch`` run in it, and are refused without it (no stock image has it).

Every other pod runs ``spec.engine.image`` exactly as written: any TensorRT-LLM release, no rebuilt image.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from trtfleet.api.basemodel import EngineSpec
from trtfleet.version import __version__
from trtfleet_operator.errors import ConfigError

DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
DEFAULT_ENGINE_IMAGE: str = EngineSpec.model_fields["image"].default
REMOVED_ENV = ("TRTFLEET_RUNTIME_IMAGE", "TRTFLEET_RUNTIME_BASE_IMAGE")
"""The rebuilt-runtime-image settings of earlier versions: refused, so that nobody believes they still apply."""


@dataclass(frozen=True)
class Images:
    trtfleet: str = f"ghcr.io/trtfleet/trtfleet:{__version__}"
    worker: str = f"ghcr.io/trtfleet/reference-worker:{__version__}"
    modelopt: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Images:
        removed = [name for name in REMOVED_ENV if env.get(name)]
        if removed:
            raise ConfigError(
                f"{', '.join(removed)} no longer exist: build and serving pods run spec.engine.image as written "
                "(stock NVIDIA images get the trtfleet command from an init container); unset them "
                "(the chart's operator.images.runtime is gone too)"
            )
        defaults = cls()
        return cls(
            trtfleet=env.get("TRTFLEET_IMAGE") or defaults.trtfleet,
            worker=env.get("TRTFLEET_WORKER_IMAGE") or defaults.worker,
            modelopt=env.get("TRTFLEET_MODELOPT_IMAGE") or None,
        )


@dataclass(frozen=True)
class BuildPolicy:
    """Engine-build Jobs: pod-level retries inside a Job, Job-level retries by the operator."""

    backoff_limit: int = 1
    deadline_s: int = 4 * 3600
    max_attempts: int = 5
    retry_base_s: float = 60.0
    retry_max_s: float = 1800.0

    def retry_delay_s(self, attempt: int) -> float:
        """Delay before attempt ``attempt + 1`` after attempt ``attempt`` failed: doubling, capped."""
        return float(min(self.retry_base_s * 2 ** max(attempt - 1, 0), self.retry_max_s))


@dataclass(frozen=True)
class Storage:
    """Where engines and converted adapters live: one PVC each, in every BaseModel's namespace."""

    engine_pvc: str = "trtfleet-engines"
    artifact_pvc: str = "trtfleet-adapters"
    engine_mount: str = "/engines"
    artifact_mount: str = "/artifacts"

    def engine_uri(self, engine_hash: str) -> str:
        return f"pvc://{self.engine_pvc}/{engine_hash}"


ROUTER_SELECTOR_DEFAULT = "app.kubernetes.io/name=trtfleet,app.kubernetes.io/component=router"
"""The chart's router pods (``trtfleet.selector`` with component router)."""


@dataclass(frozen=True)
class AutoscaleConfig:
    """Where demand signals come from and how often BaseModels with ``spec.autoscaling`` are decided."""

    interval_s: float = 15.0
    router_selector: str = ROUTER_SELECTOR_DEFAULT
    router_namespace: str | None = None
    """Namespace of the router pods; None: each BaseModel's own namespace."""
    router_metrics_port: int = 9090
    router_metrics_urls: tuple[str, ...] = ()
    """Fixed router ``/metrics`` URLs (the local/demo path); when given, no router pods are looked up."""
    scrape_timeout_s: float = 2.0
    held_wait_s: float = 20.0
    """How long one long poll of a router's held requests lasts (``holdwatch``); 0: no long poll, a base
    model scaled to zero scales up at its next autoscaling decision."""


@dataclass(frozen=True)
class MergeAdviceConfig:
    """How often every BaseModel's Adapters get merge advice, and where the routers' demand views are
    (router pods: ``--router-selector`` / ``--router-namespace``, as for autoscaling)."""

    interval_s: float = 60.0
    router_peer_port: int = 8082
    """The routers' peer port, which serves ``GET /fleet/v1/demand`` (the chart's ``router.peers.port``)."""
    router_demand_urls: tuple[str, ...] = ()
    """Fixed ``/fleet/v1/demand`` URLs (the local path); when given, no router pods are looked up."""
    router_token_file: Path | None = None
    """The routers' internal bearer tokens (:mod:`trtfleet.internalauth`), sent on the peer port (demand and held
    requests); the chart mounts the routers' Secret. None: no credential (a local router answers loopback)."""


@dataclass(frozen=True)
class InferencePoolConfig:
    """An InferencePool (Gateway API Inference Extension) per BaseModel, whose endpoint picker is this Service
    (trtfleet's picker, the chart's ``gateway.picker``), looked up in each BaseModel's own namespace: GIE's
    ``endpointPickerRef`` names a Service of the pool's namespace."""

    picker_service: str
    picker_port: int

    def __post_init__(self) -> None:
        if not DNS_LABEL.match(self.picker_service):
            raise ConfigError(f"the picker Service name {self.picker_service!r} is not a DNS label")
        if not 1 <= self.picker_port <= 65535:
            raise ConfigError(f"the picker port {self.picker_port} is not in 1..65535")


@dataclass(frozen=True)
class OperatorConfig:
    images: Images = field(default_factory=Images)
    build: BuildPolicy = field(default_factory=BuildPolicy)
    storage: Storage = field(default_factory=Storage)
    convert_backoff_limit: int = 2
    convert_deadline_s: int = 3600
    convert_node_selector: tuple[tuple[str, str], ...] = ()
    """Where adapter-convert Jobs run (CPU nodes, say); empty: anywhere."""
    collect_artifacts: bool = True
    """Remove a deleted Adapter's artifact from the adapter volume once no other Adapter uses it."""
    artifact_drain_s: float = 60.0
    """After an Adapter's deletion starts, how long requests already at pods get before its artifact goes."""
    engine_retention_s: float = 7 * 24 * 3600.0
    """How long an engine or staged checkpoint nothing uses stays on the engine volume (0: forever)."""
    collect_interval_s: float = 600.0
    """How often each engine record is checked for use."""
    image_pull_secrets: tuple[str, ...] = ()
    """Secrets every pod the operator creates pulls its images with (they must exist in each BaseModel's
    namespace); the chart passes its ``imagePullSecrets``."""
    resync_interval_s: float = 30.0
    autoscale: AutoscaleConfig = field(default_factory=AutoscaleConfig)
    merge_advice: MergeAdviceConfig = field(default_factory=MergeAdviceConfig)
    trtllm_models_dir: str = "/app/all_models/inflight_batcher_llm"
    """Where NVIDIA's Triton TRT-LLM image keeps the python models (model.py) of the model repository."""
    inference_pool: InferencePoolConfig | None = None
    """None: no InferencePools (the chart's ``gateway.inferencePool.enabled`` off)."""

    def __post_init__(self) -> None:
        if self.build.max_attempts < 1:
            raise ConfigError("--build-max-attempts must be at least 1")
        if self.build.backoff_limit < 0 or self.convert_backoff_limit < 0:
            raise ConfigError("backoff limits cannot be negative")
        if self.resync_interval_s <= 0:
            raise ConfigError("--resync-interval must be positive")
        if self.autoscale.interval_s <= 0 or self.autoscale.scrape_timeout_s <= 0:
            raise ConfigError("--autoscale-interval and the scrape timeout must be positive")
        if self.autoscale.held_wait_s < 0:
            raise ConfigError("--held-wait cannot be negative")
        if self.merge_advice.interval_s <= 0:
            raise ConfigError("--merge-interval must be positive")
        if self.artifact_drain_s < 0 or self.engine_retention_s < 0 or self.collect_interval_s <= 0:
            raise ConfigError("--adapter-drain and --engine-retention cannot be negative, --collect-interval "
                              "must be positive")


def images_from_environment() -> Images:
    return Images.from_env(os.environ)
