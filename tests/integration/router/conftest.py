"""Fixtures of the router's integration tests (helpers in :mod:`support`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.router.support import ConvertedAdapter, convert_adapters, fleet_config, reference_workers

REPLICA_STEP_MS = 20.0
"""The replica tests' workers take at least this long per token: a 200-token stream lasts >= 4 s."""


@pytest.fixture(scope="session")
def converted_adapters(tmp_path_factory: pytest.TempPathFactory) -> list[ConvertedAdapter]:
    return convert_adapters(tmp_path_factory.mktemp("router-adapters"))


@pytest.fixture(scope="module")
def workers() -> Iterator[list[Any]]:
    """Reference workers for one test module's router replicas."""
    with reference_workers(min_step_ms=REPLICA_STEP_MS) as started:
        yield started


@pytest.fixture(scope="module")
def fleet_file(
    tmp_path_factory: pytest.TempPathFactory, workers: list[Any], converted_adapters: list[ConvertedAdapter]
) -> Path:
    """The fleet file of :func:`workers` and the converted adapters, shared by a module's router processes."""
    path = tmp_path_factory.mktemp("replicas") / "fleet.yaml"
    path.write_text(yaml.safe_dump(fleet_config(workers, converted_adapters), sort_keys=False))
    return path
