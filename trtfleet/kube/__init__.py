"""The Kubernetes client layer shared by the operator and the router (on ``kubernetes_asyncio``).

``config`` - where credentials come from (kubeconfig contexts, exec plugins, client certificates,
bearer tokens, the in-cluster service account), all loaded by the library; ``client`` - :class:`KubeApi`,
JSON requests and watch streams over the library's session; ``errors`` - this layer's error tree.
Imports no component (the import-linter contract ``api-is-the-bottom`` covers it).
"""

from trtfleet.kube.client import KubeApi, Obj
from trtfleet.kube.config import KubeConnection, KubeSource, load_connection
from trtfleet.kube.errors import KubeApiError, KubeConfigError, KubeLayerError

__all__ = [
    "KubeApi",
    "KubeApiError",
    "KubeConfigError",
    "KubeConnection",
    "KubeLayerError",
    "KubeSource",
    "Obj",
    "load_connection",
]
