"""Optional API keys (off unless ``--api-keys FILE`` is given).

The file (YAML or JSON) lists keys, each optionally restricted to served names (adapters or base
models); a key without ``models`` may use every model::

    keys:
      - name: team-sql          # for logs only
        key: sk-team-sql-1234   # or  sha256: <hex digest of the key>
        models: [llama3-sql]    # optional restriction ("adapters" is accepted as a synonym)
        maxBodyBytes: 1048576   # optional: this key's requests, at most this large (below --max-body-bytes)
      - name: admin
        sha256: 9f86d0...

Clients send ``Authorization: Bearer <key>`` (HTTP, and gRPC metadata ``authorization``) or
``api-key``/``x-api-key``. No or an unknown key -> 401, a model outside the key's set -> 403, a body above the
key's ``maxBodyBytes`` -> 413 (HTTP: checked before the body is read). A presented key is looked up by its
SHA-256 digest: the lookup's time depends on the digest, which says nothing about how much of a real key a guess
matched, so the check is constant-time in what matters; the file may hold digests only. Keys are never logged
(only a key's ``name`` is, and its digest owns its files and batches).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from trtfleet_router.errors import PermissionDenied, Unauthenticated


class ApiKeySpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str = Field(default="", description="A label for logs.")
    key: str | None = Field(default=None, min_length=8, description="The key itself.")
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$", description="sha256 hex of the key.")
    models: list[str] | None = Field(default=None, description="Served names this key may use; all if unset.")
    adapters: list[str] | None = Field(default=None, description="Synonym of models.")
    max_body_bytes: int | None = Field(
        default=None, alias="maxBodyBytes", gt=0, description="Largest request body of this key (bytes)."
    )

    @model_validator(mode="after")
    def _one_key(self) -> ApiKeySpec:
        if (self.key is None) == (self.sha256 is None):
            raise ValueError("give exactly one of 'key' and 'sha256'")
        return self


class ApiKeysFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    keys: list[ApiKeySpec] = Field(min_length=1)


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    models: frozenset[str] | None  # None: every model
    owner: str | None = None
    """The sha256 hex of the key: what owns its files and batches (the key itself is never stored)."""
    max_body_bytes: int | None = None
    """This key's own body limit (None: the router's)."""

    def may_use(self, served_name: str) -> bool:
        return self.models is None or served_name in self.models


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class ApiKeys:
    def __init__(self, spec: ApiKeysFile) -> None:
        self._by_digest: dict[str, Principal] = {}
        for entry in spec.keys:
            digest = entry.sha256 if entry.sha256 is not None else _digest(entry.key or "")
            allowed = entry.models if entry.models is not None else entry.adapters
            models = None if allowed is None else frozenset(allowed)
            self._by_digest[digest] = Principal(entry.name, models, digest, entry.max_body_bytes)

    @classmethod
    def load(cls, path: Path) -> ApiKeys:
        try:
            data: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
            return cls(ApiKeysFile.model_validate(data))
        except (OSError, yaml.YAMLError, ValidationError) as exc:
            raise ValueError(f"invalid API keys file {path}: {exc}") from exc

    def authenticate(self, presented: str | None) -> Principal:
        if not presented:
            raise Unauthenticated("an API key is required (Authorization: Bearer <key>)", code="missing_api_key")
        principal = self._by_digest.get(_digest(presented))
        if principal is None:
            raise Unauthenticated("the API key is not valid", code="invalid_api_key")
        return principal

    def authorize(self, presented: str | None, served_name: str) -> Principal:
        principal = self.authenticate(presented)
        if not principal.may_use(served_name):
            raise PermissionDenied(f"this API key may not use model '{served_name}'", param="model")
        return principal


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key from ``Authorization: Bearer``, ``api-key`` or ``x-api-key`` (header names lower-cased
    or as aiohttp's case-insensitive mapping gives them)."""
    auth = headers.get("authorization") or headers.get("Authorization")
    if auth:
        scheme, _, value = auth.partition(" ")
        return value.strip() if scheme.lower() == "bearer" else None
    return headers.get("api-key") or headers.get("x-api-key") or headers.get("Api-Key") or headers.get("X-Api-Key")
