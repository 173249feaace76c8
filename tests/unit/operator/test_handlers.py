"""The one place the operator's errors become kopf's retries."""

from __future__ import annotations

import kopf
import pytest
from trtfleet_operator.errors import (
    ConflictError,
    InvalidError,
    KubeError,
    KubeUnavailableError,
    kube_error,
)
from trtfleet_operator.handlers import kopf_error


@pytest.mark.parametrize(
    ("error", "kind", "delay"),
    [
        (ConflictError(409, "Conflict", "x"), kopf.TemporaryError, 1.0),
        (KubeUnavailableError(0, "Unavailable", "x"), kopf.TemporaryError, 10.0),
        (kube_error(503, "ServiceUnavailable", "x"), kopf.TemporaryError, 10.0),
        (InvalidError(422, "Invalid", "x"), kopf.PermanentError, None),
        (KubeError(403, "Forbidden", "x"), kopf.PermanentError, None),
    ],
)
def test_errors_map_to_kopf_retries_in_one_place(error: KubeError, kind: type, delay: float | None) -> None:
    mapped = kopf_error(error)
    assert isinstance(mapped, kind)
    if delay is not None:
        assert isinstance(mapped, kopf.TemporaryError) and mapped.delay == delay
