"""The fleet file's schema (``--fleet-config``; documented in :mod:`trtfleet_router.discovery.static`).

Pydantic models, camelCase or snake_case keys; a backend may be written as ``host:grpcport[/metrics[/http]]``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from trtfleet.api.basemodel import BaseModelSpec, Runtime, ServingServer, WaitingQueuePolicy
from trtfleet_router.models_registry import DEFAULT_MAX_TOKENS, DEFAULT_UPSTREAM_MODEL


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)


class BackendConfig(_Model):
    address: str = Field(description="host:port of the pod's Triton gRPC endpoint.")
    metrics: str | None = Field(default=None, description="host:port or URL of Triton's metrics endpoint.")
    http: str | None = Field(default=None, description="host:port of Triton's HTTP endpoint (warm requests).")
    pod_id: str | None = Field(default=None, description="Pod name (default: the address).")
    uid: str | None = Field(default=None, description="Pod identity; a new uid resets the shadow cache.")


class AdapterConfig(_Model):
    served_name: str
    task_id: int = Field(ge=1, le=2**63 - 1)
    artifact: str = Field(description="Directory (path, file://, http(s)://, s3://) of the converted adapter.")
    sha256: str | None = None
    weights_bytes: int | None = Field(default=None, ge=0)
    pages: int | None = Field(default=None, ge=1)
    min_pods: int = Field(default=0, ge=0)
    lora_path: str | None = Field(
        default=None, description="runtime pytorch: the PEFT directory as the pods see it (default: artifact)."
    )


class MergedAdapterConfig(_Model):
    served_name: str
    backends: list[BackendConfig] = Field(
        default_factory=list, description="Pods serving the adapter merged (trtfleet worker --merged-adapter)."
    )

    @field_validator("backends", mode="before")
    @classmethod
    def _plain_addresses(cls, value: Any) -> Any:
        return _plain_backends(value)


class BaseVariantConfig(_Model):
    name: str = Field(description="The variant's name (its fleet is <name>@variant).")
    backends: list[BackendConfig] = Field(default_factory=list)
    adapters: list[AdapterConfig] = Field(default_factory=list, description="The QLoRA adapters trained on it.")

    @field_validator("backends", mode="before")
    @classmethod
    def _plain_addresses(cls, value: Any) -> Any:
        return _plain_backends(value)


class BaseModelConfig(_Model):
    name: str
    spec: BaseModelSpec | None = None
    architecture: str | None = Field(
        default=None,
        description="Chat template family; default llama, or the spec's (reference for the reference runtime).",
    )
    max_input_len: int = Field(default=2048, ge=1)
    max_seq_len: int = Field(default=4096, ge=2)
    host_pages: int | None = Field(default=None, ge=1)
    device_pages: int | None = Field(default=None, ge=1)
    upstream_model: str = DEFAULT_UPSTREAM_MODEL
    chat_template: str | None = None
    weights_dtype: str = Field(default="FP16", pattern="^(FP16|BF16)$")
    bytes_per_token: float | None = Field(default=None, gt=0)
    default_max_tokens: int = Field(default=DEFAULT_MAX_TOKENS, ge=1)
    runtime: Runtime | None = Field(default=None, description="Default: the spec's runtime, else tensorrtllm.")
    server: ServingServer | None = Field(default=None, description="Default: the spec's serving.server.")
    waiting_queue_policy: WaitingQueuePolicy | None = Field(
        default=None,
        description="Default: the spec's serving.waitingQueuePolicy (priority: requests carry their band as the "
        "pods' trtllm-serve priority).",
    )
    replaces: str | None = Field(default=None, description="Default: the spec's serving.replaces (a migration).")
    backends: list[BackendConfig] = Field(default_factory=list)
    adapters: list[AdapterConfig] = Field(default_factory=list)
    merged_adapters: list[MergedAdapterConfig] = Field(default_factory=list)
    base_variants: list[BaseVariantConfig] = Field(default_factory=list)

    @field_validator("backends", mode="before")
    @classmethod
    def _plain_addresses(cls, value: Any) -> Any:
        return _plain_backends(value)


def _plain_backends(value: Any) -> Any:
    if isinstance(value, list):
        return [parse_backend(v) if isinstance(v, str) else v for v in value]
    return value


class FleetConfig(_Model):
    base_models: list[BaseModelConfig] = Field(min_length=1)


def parse_backend(text: str) -> dict[str, Any]:
    """``host:grpcport[/metricsport[/httpport]]``."""
    address, *ports = text.strip().split("/")
    host = address.rsplit(":", 1)[0]
    metrics = f"{host}:{ports[0]}" if len(ports) > 0 and ports[0] else None
    http = f"{host}:{ports[1]}" if len(ports) > 1 and ports[1] else None
    return {"address": address, "metrics": metrics, "http": http}
