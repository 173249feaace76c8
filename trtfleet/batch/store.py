"""Blob stores for batch state: a local directory (a PVC in a cluster) and ``s3://bucket/prefix``.

Every write replaces a whole object atomically: a reader sees the old bytes or the new ones, never a
part, and a process killed mid-write leaves the old object (or none). Locally that is a temp file in
the same directory, fsynced, renamed over the target, then the directory fsynced so the rename itself
survives a crash; on S3 a ``PutObject`` is atomic by itself. Keys are ``/``-separated relative paths.

The methods block (file and network I/O): async callers run them in a worker thread.
"""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from trtfleet.batch.errors import NotFound, StoreError


class BlobStore(Protocol):
    """What the batch book needs of a store."""

    def put(self, key: str, data: bytes) -> None: ...

    def get(self, key: str) -> bytes: ...

    def keys(self, prefix: str) -> list[str]:
        """Keys under ``prefix`` (a ``/``-ended folder), sorted."""
        ...

    def delete(self, key: str) -> None: ...

    def describe(self) -> str: ...


def _check_key(key: str) -> str:
    parts = key.split("/")
    if not key or key.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise StoreError(f"invalid store key {key!r}")
    return key


class LocalStore:
    """A directory; atomic writes by temp file + rename + fsync of the directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the batch store directory {root}: {exc}") from exc

    def describe(self) -> str:
        return str(self.root)

    def put(self, key: str, data: bytes) -> None:
        target = self.root / _check_key(key)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(temp, target)
            except BaseException:
                Path(temp).unlink(missing_ok=True)
                raise
            directory = os.open(target.parent, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        except OSError as exc:
            raise StoreError(f"cannot write {target}: {exc}") from exc

    def get(self, key: str) -> bytes:
        path = self.root / _check_key(key)
        try:
            return path.read_bytes()
        except FileNotFoundError as exc:
            raise NotFound(f"{key} is not in the store") from exc
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc}") from exc

    def keys(self, prefix: str) -> list[str]:
        folder = self.root / prefix
        if not folder.is_dir():
            return []
        found = []
        for path in folder.rglob("*"):
            if path.is_file() and not path.name.startswith("."):
                found.append(path.relative_to(self.root).as_posix())
        return sorted(found)

    def delete(self, key: str) -> None:
        try:
            (self.root / _check_key(key)).unlink(missing_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot delete {key}: {exc}") from exc


class S3Store:
    """``s3://bucket/prefix`` through boto3 (the ``s3`` extra); endpoint, region and credentials from
    boto3's usual environment (``AWS_ENDPOINT_URL_S3`` for S3-compatible stores)."""

    def __init__(self, uri: str) -> None:
        parsed = urlparse(uri)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise StoreError(f"not an s3://bucket[/prefix] URI: {uri!r}")
        self.uri = uri
        self.bucket = parsed.netloc
        self.prefix = parsed.path.strip("/")
        self._client: Any = None
        self._lock = threading.Lock()

    def describe(self) -> str:
        return self.uri

    def _s3(self) -> Any:
        with self._lock:
            if self._client is None:
                try:
                    import boto3
                except ImportError as exc:
                    raise StoreError("an s3:// batch store needs the 's3' extra (boto3)") from exc
                self._client = boto3.client("s3")
            return self._client

    def _key(self, key: str) -> str:
        key = _check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def put(self, key: str, data: bytes) -> None:
        try:
            self._s3().put_object(Bucket=self.bucket, Key=self._key(key), Body=data)
        except StoreError:
            raise
        except Exception as exc:  # boto3 raises many unrelated types; translated at this boundary
            raise StoreError(f"cannot write s3://{self.bucket}/{self._key(key)}: {exc}") from exc

    def get(self, key: str) -> bytes:
        client = self._s3()
        try:
            answer = client.get_object(Bucket=self.bucket, Key=self._key(key))
            return bytes(answer["Body"].read())
        except client.exceptions.NoSuchKey as exc:
            raise NotFound(f"{key} is not in the store") from exc
        except Exception as exc:  # boto3: translated at this boundary
            raise StoreError(f"cannot read s3://{self.bucket}/{self._key(key)}: {exc}") from exc

    def keys(self, prefix: str) -> list[str]:
        full = self._key(prefix.rstrip("/")) + "/"
        strip = len(self.prefix) + 1 if self.prefix else 0
        found: list[str] = []
        try:
            pages = self._s3().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full)
            for page in pages:
                found.extend(item["Key"][strip:] for item in page.get("Contents", []))
        except StoreError:
            raise
        except Exception as exc:  # boto3: translated at this boundary
            raise StoreError(f"cannot list s3://{self.bucket}/{full}: {exc}") from exc
        return sorted(found)

    def delete(self, key: str) -> None:
        try:
            self._s3().delete_object(Bucket=self.bucket, Key=self._key(key))
        except StoreError:
            raise
        except Exception as exc:  # boto3: translated at this boundary
            raise StoreError(f"cannot delete s3://{self.bucket}/{self._key(key)}: {exc}") from exc


def open_store(location: str) -> BlobStore:
    """``s3://bucket/prefix``, ``file:///path`` or a plain directory path."""
    if location.startswith("s3://"):
        return S3Store(location)
    if location.startswith("file://"):
        return LocalStore(Path(urlparse(location).path))
    if "://" in location:
        raise StoreError(f"unsupported batch store {location!r}: use a directory, file:// or s3://")
    return LocalStore(Path(location))
