"""The errors of :mod:`trtfleet.kube`; each component translates them into its own tree at its boundary.

::

    KubeLayerError             anything the shared Kubernetes layer raises
    ├── KubeConfigError        no usable kubeconfig or service account (bad path, context, plugin)
    └── KubeApiError           the API server answered with an error status, or could not be reached
                               (``status`` 0); ``reason`` and ``message`` come from its Status object
"""

from __future__ import annotations


class KubeLayerError(Exception):
    """Base of every error :mod:`trtfleet.kube` raises."""


class KubeConfigError(KubeLayerError):
    """The credentials could not be loaded."""


class KubeApiError(KubeLayerError):
    """An error answer of the API server (``status`` is the HTTP status, 0 when it was unreachable)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        super().__init__(f"{status} {reason}: {message}")
