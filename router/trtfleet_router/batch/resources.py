"""Batch resources as batch records: a ``kubectl apply``-ed Batch is the same thing as a ``POST /v1/batches``.

For each Batch in the watched namespace (router with ``--kubernetes`` and ``--batch-store``):

* no record yet: the input (``spec.input``; ``spec.model`` filled into bodies without a model) becomes
  the file ``file-<batch id>-input`` and the record ``batch_<uid without dashes>`` is created with
  ``source`` ``<namespace>/<name>`` and ``spec.priority``; both ids are derived, so a router killed
  between the two steps redoes them and creates nothing twice;
* ``spec.cancel`` (or the object's deletion) cancels the record;
* a finished record's output and error files are copied under ``spec.output`` (once);
* ``status`` is patched from the record whenever it differs (:func:`status_for`, pure).

The runner does the rest, exactly as for API batches.
"""

from __future__ import annotations

import asyncio
import logging
import posixpath
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

from pydantic import ValidationError

from trtfleet.api.batch import Batch, BatchCounts, BatchPhase
from trtfleet.api.batch import BatchStatus as BatchResourceStatus
from trtfleet.api.common import Condition, ConditionStatus
from trtfleet.batch.errors import BatchLayerError, NotFound
from trtfleet.batch.lines import fill_default_model
from trtfleet.batch.records import BatchRecord, BatchStatus
from trtfleet.batch.service import BatchService
from trtfleet.batch.store import open_store
from trtfleet.kube import KubeApiError
from trtfleet_router.discovery.kubeclient import SYNC, KubeClient

log = logging.getLogger(__name__)

BATCHES_PATH: Final = "/apis/trtfleet.io/v1alpha1/namespaces/{ns}/batches"
SYNC_INTERVAL_S_DEFAULT: Final = 2.0
PHASES: Final = {
    BatchStatus.VALIDATING: BatchPhase.VALIDATING,
    BatchStatus.IN_PROGRESS: BatchPhase.RUNNING,
    BatchStatus.FINALIZING: BatchPhase.FINALIZING,
    BatchStatus.COMPLETED: BatchPhase.SUCCEEDED,
    BatchStatus.FAILED: BatchPhase.FAILED,
    BatchStatus.EXPIRED: BatchPhase.EXPIRED,
    BatchStatus.CANCELLING: BatchPhase.CANCELLING,
    BatchStatus.CANCELLED: BatchPhase.CANCELLED,
}

FINAL_PHASES: Final = frozenset({BatchPhase.SUCCEEDED, BatchPhase.FAILED, BatchPhase.EXPIRED, BatchPhase.CANCELLED})


def batch_id_for(obj: Mapping[str, Any]) -> str:
    return "batch_" + str(obj.get("metadata", {}).get("uid", "")).replace("-", "")


def _iso(epoch_s: int) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_for(
    record: BatchRecord | None,
    *,
    generation: int | None,
    output_uri: str | None = None,
    error_uri: str | None = None,
    message: str | None = None,
    cancelled: bool = False,
) -> dict[str, Any]:
    """The Batch's ``status`` (wire form) for ``record`` (None: not created; ``message`` says why, or it
    was ``cancelled`` before it started)."""
    if record is None and cancelled:
        condition = Condition(type="Complete", status=ConditionStatus.TRUE, reason="Cancelled")
        return BatchResourceStatus(
            phase=BatchPhase.CANCELLED, observed_generation=generation, conditions=[condition]
        ).to_wire()
    if record is None:
        failed = message is not None
        condition = Condition(
            type="Complete",
            status=ConditionStatus.TRUE if failed else ConditionStatus.FALSE,
            reason="InputUnreadable" if failed else "Pending",
            message=message or "",
        )
        status = BatchResourceStatus(
            phase=BatchPhase.FAILED if failed else BatchPhase.PENDING,
            observed_generation=generation,
            conditions=[condition],
            message=message,
        )
        return status.to_wire()
    counts = record.request_counts
    finished = counts.completed + counts.failed
    final = record.status.is_final
    end_s = next(
        (t for t in (record.completed_at, record.failed_at, record.expired_at, record.cancelled_at) if t), None
    )
    condition = Condition(
        type="Complete",
        status=ConditionStatus.TRUE if final else ConditionStatus.FALSE,
        reason=PHASES[record.status].value,
        message=f"{finished} of {counts.total} lines finished",
        last_transition_time=_iso(end_s) if end_s else None,
    )
    errors = "; ".join(e.message for e in record.errors) or None
    status = BatchResourceStatus(
        phase=PHASES[record.status],
        observed_generation=generation,
        batch_id=record.id,
        counts=BatchCounts(total=counts.total, completed=counts.completed, failed=counts.failed),
        progress_percent=(100 * finished // counts.total) if counts.total else (100 if final else 0),
        conditions=[condition],
        output_file_id=record.output_file_id,
        error_file_id=record.error_file_id,
        output_uri=output_uri,
        error_uri=error_uri,
        message=errors,
    )
    return status.to_wire()


def _split(uri: str) -> tuple[str, str]:
    """``s3://b/dir/in.jsonl`` -> (``s3://b/dir``, ``in.jsonl``); the same for paths and file://."""
    folder, name = posixpath.split(uri.rstrip("/"))
    return folder, name


def _read(uri: str) -> bytes:
    folder, name = _split(uri)
    return open_store(folder).get(name)


def _copy_out(output: str, files: Mapping[str, bytes]) -> dict[str, str]:
    store = open_store(output)
    for name, data in files.items():
        store.put(name, data)
    return {name: f"{output.rstrip('/')}/{name}" for name in files}


class BatchResources:
    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        service: BatchService,
        sync_interval_s: float = SYNC_INTERVAL_S_DEFAULT,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.service = service
        self.sync_interval_s = sync_interval_s
        self.objects: dict[str, Mapping[str, Any]] = {}
        self.changed = asyncio.Event()

    @property
    def path(self) -> str:
        return BATCHES_PATH.format(ns=self.namespace)

    async def run(self) -> None:
        await asyncio.gather(self._watch(), self._sync_loop())

    async def _watch(self) -> None:
        async for event, payload in self.client.watch(self.path):
            if event == SYNC:
                self.objects = {o["metadata"]["name"]: o for o in payload}
            elif event == "DELETED":
                self.objects.pop(payload["metadata"]["name"], None)
                await self._deleted(payload)
            else:
                self.objects[payload["metadata"]["name"]] = payload
            self.changed.set()

    async def _sync_loop(self) -> None:
        while True:
            self.changed.clear()
            for obj in list(self.objects.values()):
                try:
                    await self.reconcile(obj)
                except (BatchLayerError, KubeApiError) as exc:
                    name = obj.get("metadata", {}).get("name")
                    log.warning("batch resource not synced", extra={"ctx": {"batch": name, "error": str(exc)}})
            try:
                await asyncio.wait_for(self.changed.wait(), self.sync_interval_s)
            except TimeoutError:
                pass

    async def _deleted(self, obj: Mapping[str, Any]) -> None:
        try:
            await self.service.cancel(batch_id_for(obj))
        except BatchLayerError:
            pass  # never created, or already finished: nothing to stop

    async def reconcile(self, obj: Mapping[str, Any]) -> None:
        metadata = obj.get("metadata", {})
        try:
            batch = Batch.model_validate(obj)
        except ValidationError as exc:
            log.warning("Batch ignored", extra={"ctx": {"batch": metadata.get("name"), "error": str(exc)[:500]}})
            return
        spec, batch_id = batch.spec, batch_id_for(obj)
        current = batch.status or BatchResourceStatus()
        if current.phase in FINAL_PHASES and current.observed_generation == metadata.get("generation"):
            return  # finished and reported: nothing left to do (a later spec change is a new generation)
        try:
            record: BatchRecord | None = await self.service.batch(batch_id)
        except NotFound:
            record = None
        message = None
        if record is None and not spec.cancel:
            try:
                record = await self._create(batch, batch_id, f"{self.namespace}/{metadata.get('name')}")
            except BatchLayerError as exc:
                message = f"cannot start the batch from {spec.input}: {exc.message}"
        if record is not None and spec.cancel and record.status.cancellable:
            record = await self.service.cancel(batch_id)
        output_uri, error_uri = current.output_uri, current.error_uri
        if record is not None and record.status.is_final and spec.output and output_uri is None and error_uri is None:
            output_uri, error_uri = await self._copy(record, spec.output)
        status = status_for(
            record,
            generation=metadata.get("generation"),
            output_uri=output_uri,
            error_uri=error_uri,
            message=message,
            cancelled=spec.cancel,
        )
        if status != current.to_wire():
            await self.client.api().request(
                "PATCH",
                f"{self.path}/{metadata['name']}/status",
                body={"status": status},
                content_type="application/merge-patch+json",
            )

    async def _create(self, batch: Batch, batch_id: str, source: str) -> BatchRecord:
        spec = batch.spec
        data = await asyncio.to_thread(_read, spec.input)
        if spec.model:
            data = fill_default_model(data, spec.model)
        file_id = f"file-{batch_id}-input"
        await self.service.upload(filename=_split(spec.input)[1], purpose="batch", data=data, file_id=file_id)
        record = await self.service.create(
            endpoint=spec.endpoint.value,
            input_file_id=file_id,
            completion_window=spec.deadline,
            source=source,
            batch_id=batch_id,
            priority=spec.priority,
        )
        log.info("batch resource started", extra={"ctx": {"batch": source, "batch_id": batch_id}})
        return record

    async def _copy(self, record: BatchRecord, output: str) -> tuple[str | None, str | None]:
        files: dict[str, bytes] = {}
        if record.output_file_id:
            files["output.jsonl"] = await self.service.file_content(record.output_file_id)
        if record.error_file_id:
            files["errors.jsonl"] = await self.service.file_content(record.error_file_id)
        uris = await asyncio.to_thread(_copy_out, output, files)
        return uris.get("output.jsonl"), uris.get("errors.jsonl")
