"""The weight store: converted LoRA adapters, verified and pre-serialised, in a bounded host LRU.

An artifact is a directory (``file://``/plain path, ``pvc://claim/path`` read where the claim is mounted
under ``$TRTFLEET_PVC_ROOT`` (default ``/mnt/trtfleet/pvc``), ``http(s)://`` or ``s3://``) holding
``model.lora_weights.npy`` ([1, N, W], the engine dtype), ``model.lora_config.npy`` (int32 [1, N, 3]) and
``manifest.json`` (``trtfleet.lora/v1``: ``outputs: {file: {sha256, size_bytes}}``). A load checks both
``.npy`` files against the manifest and, when the Adapter status (or the fleet config) gives an expected
sha256, that it names this artifact: the sha256 of ``model.lora_weights.npy`` (the adapter's content
identity, as the operator records it) or of ``manifest.json`` itself. Any mismatch is a
:class:`~trtfleet_router.errors.WeightsUnavailable`.

Loaded adapters are kept as the raw little-endian bytes that go into ``raw_input_contents``, with their
shapes and Triton datatypes, so the hot path does no numpy work. The cache is bounded in bytes (LRU);
concurrent loads of one artifact are coalesced into one load with many waiters.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol
from urllib.parse import urlparse

import numpy as np

from trtfleet_router.errors import WeightsUnavailable
from trtfleet_router.metrics import RouterMetrics

log = logging.getLogger(__name__)

WEIGHTS_FILE: Final = "model.lora_weights.npy"
CONFIG_FILE: Final = "model.lora_config.npy"
MANIFEST_FILE: Final = "manifest.json"
DEFAULT_CAPACITY_BYTES: Final = 2 * 1024**3
LORA_CONFIG_COLUMNS: Final = 3


@dataclass(frozen=True, slots=True)
class ArtifactRef:
    """Where an adapter's converted weights live, and the digest they must have."""

    uri: str
    sha256: str | None = None


@dataclass(frozen=True, slots=True)
class AdapterWeights:
    """``lora_weights`` and ``lora_config`` as raw tensor bytes, ready for ``raw_input_contents``."""

    weights_raw: bytes
    weights_shape: tuple[int, ...]
    weights_datatype: str
    config_raw: bytes
    config_shape: tuple[int, ...]
    weights_sha256: str

    @property
    def nbytes(self) -> int:
        return len(self.weights_raw) + len(self.config_raw)


class ArtifactReader(Protocol):
    """Reads one file of an artifact directory."""

    async def read(self, uri: str, name: str) -> bytes: ...


class FileReader:
    """``file:///dir`` or a plain path; reads in a worker thread (never blocks the event loop)."""

    async def read(self, uri: str, name: str) -> bytes:
        parsed = urlparse(uri)
        base = Path(parsed.path if parsed.scheme == "file" else uri)
        try:
            return await asyncio.to_thread((base / name).read_bytes)
        except OSError as exc:
            raise WeightsUnavailable(f"cannot read {name} of adapter artifact {uri}: {exc}") from exc


class HttpReader:
    """``http(s)://host/dir``: GET ``dir/name`` with aiohttp (one session, created lazily)."""

    def __init__(self, timeout_s: float = 60.0) -> None:
        self.timeout_s = timeout_s
        self._session: Any = None

    async def read(self, uri: str, name: str) -> bytes:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        url = uri.rstrip("/") + "/" + name
        try:
            async with self._session.get(url) as response:
                response.raise_for_status()
                return bytes(await response.read())
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise WeightsUnavailable(f"cannot fetch {url}: {exc}") from exc

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class S3Reader:
    """``s3://bucket/prefix`` through boto3 (the ``s3`` extra), in a worker thread. One client for the
    process (boto3 clients are thread-safe; making one costs tens of milliseconds); endpoint, region and
    credentials come from boto3's usual environment (``AWS_ENDPOINT_URL_S3`` for S3-compatible stores)."""

    def __init__(self) -> None:
        self._client: Any = None
        self._lock = threading.Lock()

    def _s3(self) -> Any:
        with self._lock:
            if self._client is None:
                import boto3

                self._client = boto3.client("s3")
            return self._client

    async def read(self, uri: str, name: str) -> bytes:
        try:
            import boto3  # noqa: F401  # only to fail early with the install hint
        except ImportError as exc:
            raise WeightsUnavailable("s3:// artifacts need the 's3' extra (boto3)") from exc
        parsed = urlparse(uri)
        key = parsed.path.lstrip("/").rstrip("/") + "/" + name

        def fetch() -> bytes:
            body = self._s3().get_object(Bucket=parsed.netloc, Key=key)["Body"]
            return bytes(body.read())

        try:
            return await asyncio.to_thread(fetch)
        except Exception as exc:  # boto3 raises many unrelated types; translate all at this boundary
            raise WeightsUnavailable(f"cannot fetch s3://{parsed.netloc}/{key}: {exc}") from exc


DEFAULT_PVC_ROOT: Final = "/mnt/trtfleet/pvc"


def pvc_path(uri: str, root: str | None = None) -> str:
    """Where ``pvc://claim/path`` is mounted in this container: ``<root>/<claim>/<path>``."""
    parsed = urlparse(uri)
    base = root or os.environ.get("TRTFLEET_PVC_ROOT", DEFAULT_PVC_ROOT)
    return str(Path(base) / parsed.netloc / parsed.path.lstrip("/"))


class SchemeReader:
    """Dispatches on the URI scheme."""

    def __init__(self, pvc_root: str | None = None) -> None:
        self.pvc_root = pvc_root
        self.file = FileReader()
        self.http = HttpReader()
        self.s3 = S3Reader()

    async def read(self, uri: str, name: str) -> bytes:
        scheme = urlparse(uri).scheme
        if scheme in ("http", "https"):
            return await self.http.read(uri, name)
        if scheme == "s3":
            return await self.s3.read(uri, name)
        if scheme in ("", "file"):
            return await self.file.read(uri, name)
        if scheme == "pvc":
            return await self.file.read(pvc_path(uri, self.pvc_root), name)
        raise WeightsUnavailable(f"unsupported artifact uri scheme '{scheme}' in {uri}")

    async def close(self) -> None:
        await self.http.close()


# -- pure parsing ---------------------------------------------------------------------------------------


def manifest_file_digests(manifest: Mapping[str, Any]) -> dict[str, str]:
    """``{file name: sha256}`` of the converted files (``outputs: {name: {sha256, ...}}``)."""
    digests: dict[str, str] = {}
    section = manifest.get("outputs")
    if isinstance(section, Mapping):
        for name, value in section.items():
            if isinstance(value, str):
                digests[str(name)] = value
            elif isinstance(value, Mapping) and isinstance(value.get("sha256"), str):
                digests[str(name)] = value["sha256"]
    return digests


def npy_to_raw(data: bytes, name: str) -> tuple[bytes, tuple[int, ...], str]:
    """A ``.npy`` file -> (raw little-endian bytes, shape, Triton datatype)."""
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise WeightsUnavailable(f"{name} is not a valid .npy file: {exc}") from exc
    if array.dtype == np.float16:
        datatype = "FP16"
    elif array.dtype.kind == "V" and array.dtype.itemsize == 2:
        datatype = "BF16"  # numpy has no bfloat16: converters store it as raw 2-byte voids
    elif array.dtype == np.int32:
        datatype = "INT32"
    else:
        raise WeightsUnavailable(f"{name} has dtype {array.dtype}; expected float16, bfloat16 or int32")
    if array.dtype.byteorder == ">":
        array = array.byteswap().view(array.dtype.newbyteorder("<"))
    return np.ascontiguousarray(array).tobytes(), tuple(int(d) for d in array.shape), datatype


def parse_artifact(files: Mapping[str, bytes], expected_sha256: str | None, uri: str) -> AdapterWeights:
    """Verify and convert an artifact's three files (pure)."""
    try:
        manifest = json.loads(files[MANIFEST_FILE])
    except (ValueError, UnicodeDecodeError) as exc:
        raise WeightsUnavailable(f"{uri}/{MANIFEST_FILE} is not valid JSON: {exc}") from exc
    if not isinstance(manifest, dict):
        raise WeightsUnavailable(f"{uri}/{MANIFEST_FILE} is not a JSON object")
    declared = manifest_file_digests(manifest)
    digest = declared.get(WEIGHTS_FILE, "")
    identities = {digest, hashlib.sha256(files[MANIFEST_FILE]).hexdigest()}
    if expected_sha256 is not None and expected_sha256 not in identities:
        raise WeightsUnavailable(
            f"adapter artifact {uri} has weights sha256 {digest} but {expected_sha256} was expected"
        )
    for name in (WEIGHTS_FILE, CONFIG_FILE):
        want = declared.get(name)
        if want is None:
            raise WeightsUnavailable(f"{uri}/{MANIFEST_FILE} lists no sha256 for {name}")
        got = hashlib.sha256(files[name]).hexdigest()
        if got != want:
            raise WeightsUnavailable(f"{uri}/{name} has sha256 {got} but its manifest says {want}")
    weights_raw, weights_shape, weights_datatype = npy_to_raw(files[WEIGHTS_FILE], WEIGHTS_FILE)
    config_raw, config_shape, config_datatype = npy_to_raw(files[CONFIG_FILE], CONFIG_FILE)
    if weights_datatype not in ("FP16", "BF16"):
        raise WeightsUnavailable(f"{uri}/{WEIGHTS_FILE} must be float16 or bfloat16")
    if config_datatype != "INT32" or len(config_shape) != 3 or config_shape[2] != LORA_CONFIG_COLUMNS:
        raise WeightsUnavailable(f"{uri}/{CONFIG_FILE} must be int32 [1, N, 3], got {config_shape}")
    if len(weights_shape) != 3 or weights_shape[:2] != config_shape[:2]:
        raise WeightsUnavailable(
            f"{uri}: lora_weights {weights_shape} and lora_config {config_shape} disagree on [1, N]"
        )
    return AdapterWeights(weights_raw, weights_shape, weights_datatype, config_raw, config_shape, digest)


# -- the store ------------------------------------------------------------------------------------------


class WeightStore:
    """Bounded (bytes) LRU of :class:`AdapterWeights`, with coalesced concurrent loads."""

    def __init__(
        self,
        capacity_bytes: int = DEFAULT_CAPACITY_BYTES,
        reader: ArtifactReader | None = None,
        metrics: RouterMetrics | None = None,
    ) -> None:
        self.capacity_bytes = capacity_bytes
        self.reader: ArtifactReader = reader if reader is not None else SchemeReader()
        self.metrics = metrics
        self._cache: OrderedDict[ArtifactRef, AdapterWeights] = OrderedDict()
        self._loading: dict[ArtifactRef, asyncio.Task[AdapterWeights]] = {}
        self.held_bytes = 0
        self.loads = 0

    def __contains__(self, ref: ArtifactRef) -> bool:
        return ref in self._cache

    async def get(self, ref: ArtifactRef) -> AdapterWeights:
        """The adapter's weights: from the cache, from a load in progress, or from a new load.

        The load runs in a task of its own, so a waiter that is cancelled (its client went away)
        never cancels the load the other waiters share.
        """
        cached = self._cache.get(ref)
        if cached is not None:
            self._cache.move_to_end(ref)
            return cached
        task = self._loading.get(ref)
        if task is None:
            task = asyncio.create_task(self._load_and_insert(ref), name=f"load-adapter {ref.uri}")
            self._loading[ref] = task
            task.add_done_callback(lambda done: self._load_finished(ref, done))
        return await asyncio.shield(task)

    def _load_finished(self, ref: ArtifactRef, task: asyncio.Task[AdapterWeights]) -> None:
        self._loading.pop(ref, None)
        if not task.cancelled():
            task.exception()  # retrieved here, so a load nobody waits for any more logs nothing

    async def _load_and_insert(self, ref: ArtifactRef) -> AdapterWeights:
        try:
            weights = await self._load(ref)
        except WeightsUnavailable:
            self._count("error")
            raise
        self._count("ok")
        self._insert(ref, weights)
        return weights

    async def _load(self, ref: ArtifactRef) -> AdapterWeights:
        self.loads += 1
        names = (MANIFEST_FILE, WEIGHTS_FILE, CONFIG_FILE)
        contents = await asyncio.gather(*(self.reader.read(ref.uri, name) for name in names))
        files = dict(zip(names, contents, strict=True))
        weights = await asyncio.to_thread(parse_artifact, files, ref.sha256, ref.uri)
        log.info("adapter weights loaded", extra={"ctx": {"uri": ref.uri, "bytes": weights.nbytes}})
        return weights

    def _insert(self, ref: ArtifactRef, weights: AdapterWeights) -> None:
        if weights.nbytes > self.capacity_bytes:
            return  # served to this caller, never cached
        self._cache[ref] = weights
        self.held_bytes += weights.nbytes
        while self.held_bytes > self.capacity_bytes:
            _, evicted = self._cache.popitem(last=False)
            self.held_bytes -= evicted.nbytes
        if self.metrics is not None:
            self.metrics.weight_store_bytes.set(self.held_bytes)

    def _count(self, result: str) -> None:
        if self.metrics is not None:
            self.metrics.weight_store_loads.labels(result).inc()
