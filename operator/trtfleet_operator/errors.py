"""The operator's error tree: every error ``trtfleet_operator`` raises on purpose.

::

    OperatorError                 anything the operator refuses or fails to do
    ├── ConfigError               bad flags or environment at start-up (exit code 2)
    ├── PlanningError             the engine tooling cannot plan this spec (fix the spec; never retried as is)
    ├── TaskIdConflictError       the compare-and-swap on status.nextTaskId kept losing (retried later)
    └── KubeError                 the API server answered with an error, or could not be reached
        ├── KubeUnavailableError  connection refused, reset or timed out (retried)
        ├── NotFoundError         404
        ├── ConflictError         409: a stale resourceVersion or an apply conflict (retried)
        └── InvalidError          422: the object was rejected (a bug in a builder or an immutable field)

Foreign exceptions (:class:`trtfleet.kube.KubeApiError` in ``kube.py``, the engine tooling's
``SpecError``) are translated at the boundary with ``raise ... from exc``. How each error maps to kopf's
retry semantics is decided in exactly one place: :func:`trtfleet_operator.handlers.kopf_error`.
"""

from __future__ import annotations


class OperatorError(Exception):
    """Base of every error the operator raises on purpose."""


class ConfigError(OperatorError):
    """The operator's flags or environment are invalid."""


class PlanningError(OperatorError):
    """The engine tooling cannot plan this spec; ``reason`` is a CamelCase condition reason."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


class TaskIdConflictError(OperatorError):
    """The compare-and-swap on ``status.nextTaskId`` lost too many times in a row."""


class KubeError(OperatorError):
    """An error answer of the API server (``status`` is the HTTP status, 0 when unreachable)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        self.status = status
        self.reason = reason
        super().__init__(f"{status} {reason}: {message}")
        self.message = message


class KubeUnavailableError(KubeError):
    """The API server could not be reached."""


class NotFoundError(KubeError):
    """404: the object does not exist."""


class ConflictError(KubeError):
    """409: resourceVersion mismatch or a server-side apply conflict."""


class InvalidError(KubeError):
    """422: the API server rejected the object."""


def kube_error(status: int, reason: str, message: str) -> KubeError:
    """The most specific :class:`KubeError` for an HTTP status."""
    cls = {404: NotFoundError, 409: ConflictError, 422: InvalidError}.get(status, KubeError)
    return cls(status, reason, message)
