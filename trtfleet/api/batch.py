"""The ``Batch`` custom resource: an offline batch of OpenAI requests whose input is already in storage.

A router started with ``--batch-store`` and ``--kubernetes`` picks each Batch up: it copies the input
into its batch store as a file, creates the same batch record ``POST /v1/batches`` creates (id
``batch_<uid without dashes>``), runs it with the same runner, and writes ``status`` from the record.
When the batch ends, its output and error files are copied under ``spec.output`` (when set).
Setting ``spec.cancel`` cancels it (lines in flight finish; what finished is kept).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import Field

from trtfleet.api.common import ApiModel, Condition

STORAGE_URI_PATTERN = r"^(s3://[a-z0-9][a-z0-9.-]{1,62}(/.*)?|file:///.+|/.+)$"
WINDOW_PATTERN = r"^[1-9][0-9]{0,3}h$"


class BatchEndpoint(StrEnum):
    COMPLETIONS = "/v1/completions"
    CHAT_COMPLETIONS = "/v1/chat/completions"


class BatchPhase(StrEnum):
    PENDING = "Pending"
    VALIDATING = "Validating"
    RUNNING = "Running"
    FINALIZING = "Finalizing"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    EXPIRED = "Expired"
    CANCELLING = "Cancelling"
    CANCELLED = "Cancelled"


def _immutable(field: str) -> dict[str, Any]:
    return {
        "x-kubernetes-validations": [
            {"rule": "self == oldSelf", "message": f"{field} is immutable: create a new Batch instead"}
        ]
    }


class BatchSpec(ApiModel):
    input: str = Field(
        pattern=STORAGE_URI_PATTERN,
        max_length=2048,
        description="The JSONL input (OpenAI's batch input format): s3://bucket/key, file:///path, or an "
        "absolute path in the router pod (a mounted PVC). Immutable.",
        json_schema_extra=_immutable("input"),
    )
    endpoint: BatchEndpoint = Field(
        default=BatchEndpoint.COMPLETIONS,
        description="/v1/completions or /v1/chat/completions; every line's url must equal it. Immutable.",
        json_schema_extra=_immutable("endpoint"),
    )
    model: str | None = Field(
        default=None,
        max_length=253,
        description="Default model (a BaseModel or an Adapter's served name) for lines whose body has no model.",
    )
    output: str | None = Field(
        default=None,
        pattern=STORAGE_URI_PATTERN,
        max_length=2048,
        description="Folder (s3://bucket/prefix, file:///path or an absolute path) the output.jsonl and "
        "errors.jsonl files are copied to when the batch ends; without it they stay in the router's batch "
        "store (GET /v1/files/{id}/content).",
    )
    priority: int = Field(
        default=0,
        ge=-100,
        le=100,
        description="Among unfinished batches, higher priorities run first (ties: oldest first). Interactive "
        "requests always go before any batch.",
    )
    deadline: str = Field(
        default="24h",
        pattern=WINDOW_PATTERN,
        description="How long after creation the batch may run (OpenAI's completion_window), whole hours; "
        "lines not run by then are left out and the batch ends Expired.",
    )
    cancel: bool = Field(
        default=False,
        description="Set to true to cancel: lines in flight finish, the rest are not run, results so far are kept.",
        json_schema_extra={
            "x-kubernetes-validations": [{"rule": "!oldSelf || self", "message": "a cancelled Batch stays cancelled"}]
        },
    )


class BatchCounts(ApiModel):
    total: int = Field(default=0, ge=0, description="Request lines in the input.")
    completed: int = Field(default=0, ge=0, description="Lines answered with status 200 (the output file).")
    failed: int = Field(default=0, ge=0, description="Lines rejected or answered with an error (the error file).")


class BatchStatus(ApiModel):
    phase: BatchPhase = Field(default=BatchPhase.PENDING, description="Where the batch stands.")
    observed_generation: int | None = Field(default=None, description="Generation the status describes.")
    batch_id: str | None = Field(
        default=None, description="The id under /v1/batches (the same batch through the OpenAI API)."
    )
    counts: BatchCounts = Field(default_factory=BatchCounts, description="Request counts.")
    progress_percent: int = Field(default=0, ge=0, le=100, description="Lines finished, percent of total.")
    conditions: list[Condition] | None = Field(
        default=None,
        description="Kubernetes-style conditions (Complete).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    output_file_id: str | None = Field(default=None, description="OpenAI file id of the output file.")
    error_file_id: str | None = Field(default=None, description="OpenAI file id of the error file.")
    output_uri: str | None = Field(default=None, description="Where output.jsonl was copied (spec.output).")
    error_uri: str | None = Field(default=None, description="Where errors.jsonl was copied (spec.output).")
    message: str | None = Field(default=None, max_length=4096, description="Why the batch failed, when it did.")


class Batch(ApiModel):
    """The whole Batch object as stored by Kubernetes."""

    api_version: Literal["trtfleet.io/v1alpha1"] = Field(default="trtfleet.io/v1alpha1")
    kind: Literal["Batch"] = "Batch"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: BatchSpec
    status: BatchStatus | None = None

    model_config = ApiModel.model_config | {"extra": "ignore"}
