"""Optional API keys: 401 without a valid key, 403 outside the key's models."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from trtfleet_router.errors import PermissionDenied, Unauthenticated
from trtfleet_router.server.auth import ApiKeys, presented_key

KEYS_YAML = f"""
keys:
  - name: sql-team
    key: sk-sql-team-0001
    adapters: [llama3-sql]
  - name: admin
    sha256: {hashlib.sha256(b"sk-admin-secret").hexdigest()}
"""


@pytest.fixture
def keys(tmp_path: Path) -> ApiKeys:
    path = tmp_path / "keys.yaml"
    path.write_text(KEYS_YAML)
    return ApiKeys.load(path)


def test_restricted_key(keys: ApiKeys) -> None:
    assert keys.authorize("sk-sql-team-0001", "llama3-sql").name == "sql-team"
    with pytest.raises(PermissionDenied):
        keys.authorize("sk-sql-team-0001", "other-adapter")


def test_digest_key_may_use_everything(keys: ApiKeys) -> None:
    assert keys.authorize("sk-admin-secret", "anything").name == "admin"


@pytest.mark.parametrize("presented", [None, "", "sk-wrong-key-000"])
def test_unauthenticated(keys: ApiKeys, presented: str | None) -> None:
    with pytest.raises(Unauthenticated):
        keys.authorize(presented, "llama3-sql")


def test_invalid_files(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"keys": [{"name": "x", "key": "sk-123456789", "sha256": "' + "a" * 64 + '"}]}')
    with pytest.raises(ValueError, match="exactly one"):
        ApiKeys.load(path)
    path.write_text('{"keys": []}')
    with pytest.raises(ValueError):
        ApiKeys.load(path)


@pytest.mark.parametrize(
    ("headers", "key"),
    [
        ({"Authorization": "Bearer sk-1"}, "sk-1"),
        ({"authorization": "bearer  sk-2 "}, "sk-2"),
        ({"Authorization": "Basic abc"}, None),
        ({"api-key": "sk-3"}, "sk-3"),
        ({"x-api-key": "sk-4"}, "sk-4"),
        ({}, None),
    ],
)
def test_presented_key(headers: dict[str, str], key: str | None) -> None:
    assert presented_key(headers) == key
