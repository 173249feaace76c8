"""Fixtures of the router's integration tests (helpers in :mod:`support`)."""

from __future__ import annotations

import pytest

from tests.integration.router.support import ConvertedAdapter, convert_adapters


@pytest.fixture(scope="session")
def converted_adapters(tmp_path_factory: pytest.TempPathFactory) -> list[ConvertedAdapter]:
    return convert_adapters(tmp_path_factory.mktemp("router-adapters"))
