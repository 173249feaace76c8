"""OpenAI's File and Batch objects as frozen records, their JSON forms and the batch's status rules (pure).

Status transitions (OpenAI's)::

    validating -> in_progress -> finalizing -> completed
    validating -> failed                         (the input file cannot be read as a batch at all)
    validating | in_progress -> cancelling -> cancelled
    in_progress -> finalizing -> expired         (the completion window closed first; results so far kept)

Ids: ``file-<hex>`` and ``batch_<hex>``; a batch's output and error files have ids derived from the
batch's (``file-<batch>-output``), so finalizing twice after a crash writes the same files again.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

from trtfleet.batch.errors import InvalidBatchRequest

ENDPOINTS: Final = ("/v1/completions", "/v1/chat/completions")
FILE_PURPOSES: Final = ("batch", "batch_output")
COMPLETION_WINDOW_RE: Final = re.compile(r"^([1-9][0-9]{0,3})h$")
METADATA_MAX_PAIRS: Final = 16
METADATA_KEY_MAX_CHARS: Final = 64
METADATA_VALUE_MAX_CHARS: Final = 512


class BatchStatus(StrEnum):
    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        return self in (BatchStatus.FAILED, BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.CANCELLED)

    @property
    def cancellable(self) -> bool:
        return self in (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS)


_STATUS_TIMESTAMP: Final = {
    BatchStatus.FAILED: "failed_at",
    BatchStatus.IN_PROGRESS: "in_progress_at",
    BatchStatus.FINALIZING: "finalizing_at",
    BatchStatus.COMPLETED: "completed_at",
    BatchStatus.EXPIRED: "expired_at",
    BatchStatus.CANCELLING: "cancelling_at",
    BatchStatus.CANCELLED: "cancelled_at",
}


@dataclass(frozen=True, slots=True)
class FileRecord:
    id: str
    purpose: str
    bytes: int
    filename: str
    created_at: int
    owner: str | None = None
    """Who may see the file: the sha256 of the creator's API key (None: everyone; keys off, or a Batch
    resource's own file); see :func:`visible_to`."""

    def to_json(self) -> dict[str, Any]:
        """The stored form: OpenAI's object plus ``owner``."""
        stored = self.to_openai()
        if self.owner is not None:
            stored["owner"] = self.owner
        return stored

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> FileRecord:
        return cls(
            raw["id"], raw["purpose"], int(raw["bytes"]), raw["filename"], int(raw["created_at"]), raw.get("owner")
        )


def visible_to(owner: str | None, caller: str | None) -> bool:
    """Whether a file or batch of ``owner`` is visible to ``caller`` (pure): every object to an unrestricted
    caller (None: API keys off, or the runner itself), an unowned object to everyone, else only to its owner."""
    return caller is None or owner is None or owner == caller


@dataclass(frozen=True, slots=True)
class RequestCounts:
    total: int = 0
    completed: int = 0
    failed: int = 0


@dataclass(frozen=True, slots=True)
class LineErrorSummary:
    """One entry of the batch's ``errors.data`` (input problems that fail the whole batch)."""

    code: str
    message: str
    line: int | None = None
    param: str | None = None


@dataclass(frozen=True, slots=True)
class BatchRecord:
    id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: BatchStatus
    created_at: int
    expires_at: int
    request_counts: RequestCounts = field(default_factory=RequestCounts)
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: tuple[LineErrorSummary, ...] = ()
    metadata: Mapping[str, str] | None = None
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    source: str = "api"
    """``api`` for batches created with ``POST /v1/batches``; ``<namespace>/<name>`` for a Batch resource."""
    priority: int = 0
    """Higher runs first among unfinished batches (a Batch resource's ``spec.priority``; 0 from the API)."""
    allowed_models: tuple[str, ...] | None = None
    """The models the creator's API key may use (None: every model); other lines are ``model_not_found``."""
    owner: str | None = None
    """The sha256 of the creator's API key (None: everyone may see it); its result files get the same."""

    def moved_to(self, status: BatchStatus, now_s: int) -> BatchRecord:
        """The record in ``status``, its timestamp set (a repeated move keeps the first timestamp)."""
        stamp = _STATUS_TIMESTAMP.get(status)
        changes: dict[str, Any] = {"status": status}
        if stamp is not None and getattr(self, stamp) is None:
            changes[stamp] = now_s
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        """The stored form: OpenAI's object plus ``source`` and ``priority``."""
        stored = {**self.to_openai(), "source": self.source, "priority": self.priority}
        if self.allowed_models is not None:
            stored["allowed_models"] = list(self.allowed_models)
        if self.owner is not None:
            stored["owner"] = self.owner
        return stored

    def to_openai(self) -> dict[str, Any]:
        errors = None
        if self.errors:
            errors = {
                "object": "list",
                "data": [{k: v for k, v in dataclasses.asdict(e).items()} for e in self.errors],
            }
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "errors": errors,
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status.value,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.created_at,
            "in_progress_at": self.in_progress_at,
            "expires_at": self.expires_at,
            "finalizing_at": self.finalizing_at,
            "completed_at": self.completed_at,
            "failed_at": self.failed_at,
            "expired_at": self.expired_at,
            "cancelling_at": self.cancelling_at,
            "cancelled_at": self.cancelled_at,
            "request_counts": dataclasses.asdict(self.request_counts),
            "metadata": dict(self.metadata) if self.metadata is not None else None,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> BatchRecord:
        errors = raw.get("errors") or {}
        return cls(
            id=raw["id"],
            endpoint=raw["endpoint"],
            input_file_id=raw["input_file_id"],
            completion_window=raw["completion_window"],
            status=BatchStatus(raw["status"]),
            created_at=int(raw["created_at"]),
            expires_at=int(raw["expires_at"]),
            request_counts=RequestCounts(**raw.get("request_counts", {})),
            output_file_id=raw.get("output_file_id"),
            error_file_id=raw.get("error_file_id"),
            errors=tuple(LineErrorSummary(**e) for e in errors.get("data", [])),
            metadata=raw.get("metadata"),
            source=raw.get("source", "api"),
            priority=int(raw.get("priority", 0)),
            allowed_models=tuple(raw["allowed_models"]) if raw.get("allowed_models") is not None else None,
            owner=raw.get("owner"),
            **{stamp: raw.get(stamp) for stamp in _STATUS_TIMESTAMP.values()},
        )


def completion_window_s(window: str) -> int:
    """``24h`` -> 86400; OpenAI accepts only ``24h``, trtfleet any whole number of hours up to 9999."""
    found = COMPLETION_WINDOW_RE.match(window) if isinstance(window, str) else None
    if found is None:
        raise InvalidBatchRequest(
            f"completion_window must be a whole number of hours such as '24h', not {window!r}",
            param="completion_window",
        )
    return int(found.group(1)) * 3600


def validate_metadata(metadata: Any) -> dict[str, str] | None:
    """OpenAI's rules: up to 16 pairs, keys up to 64 characters, string values up to 512."""
    if metadata is None:
        return None
    if not isinstance(metadata, dict) or len(metadata) > METADATA_MAX_PAIRS:
        raise InvalidBatchRequest(f"metadata must be an object of at most {METADATA_MAX_PAIRS} pairs", param="metadata")
    for key, value in metadata.items():
        if len(key) > METADATA_KEY_MAX_CHARS or not isinstance(value, str) or len(value) > METADATA_VALUE_MAX_CHARS:
            raise InvalidBatchRequest(
                f"metadata keys must have at most {METADATA_KEY_MAX_CHARS} characters and values be strings "
                f"of at most {METADATA_VALUE_MAX_CHARS}",
                param="metadata",
            )
    return dict(metadata)


def new_batch(
    *,
    batch_id: str,
    endpoint: Any,
    input_file: FileRecord,
    completion_window: Any,
    metadata: Any,
    now_s: int,
    source: str = "api",
    priority: int = 0,
    allowed_models: tuple[str, ...] | None = None,
    owner: str | None = None,
) -> BatchRecord:
    """A validated new batch in ``validating`` (raises :class:`InvalidBatchRequest` as OpenAI answers 400)."""
    if endpoint not in ENDPOINTS:
        raise InvalidBatchRequest(f"endpoint must be one of {', '.join(ENDPOINTS)}, not {endpoint!r}", param="endpoint")
    if input_file.purpose != "batch":
        raise InvalidBatchRequest(
            f"file {input_file.id} has purpose {input_file.purpose!r}; a batch input needs purpose 'batch'",
            param="input_file_id",
        )
    window_s = completion_window_s(completion_window)
    return BatchRecord(
        id=batch_id,
        endpoint=endpoint,
        input_file_id=input_file.id,
        completion_window=completion_window,
        status=BatchStatus.VALIDATING,
        created_at=now_s,
        expires_at=now_s + window_s,
        metadata=validate_metadata(metadata),
        source=source,
        priority=priority,
        allowed_models=allowed_models,
        owner=owner,
    )


def output_file_id(batch_id: str) -> str:
    return f"file-{batch_id}-output"


def error_file_id(batch_id: str) -> str:
    return f"file-{batch_id}-errors"
