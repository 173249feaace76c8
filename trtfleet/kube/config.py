"""Where the Kubernetes credentials come from: wholly ``kubernetes_asyncio``'s loaders.

Order (the same for the operator, kopf's login and the router):

1. an explicit kubeconfig path (and context), else ``$KUBECONFIG`` (a ``:``-separated list, merged by the
   library), when set;
2. the in-cluster service account, when ``KUBERNETES_SERVICE_HOST`` is set and its token file exists
   (the library re-reads the token every minute; :class:`trtfleet.kube.client.KubeApi` also reloads at
   once on a 401, so a rotated token is picked up without waiting);
3. ``~/.kube/config``.

Every kubeconfig credential kind the library knows works: client certificates (files or inline data),
bearer tokens and token files, exec plugins (token or client-certificate output), the ``gcp`` and
``oidc`` auth providers, ``insecure-skip-tls-verify``, ``tls-server-name``, ``proxy-url``. Nothing here
parses a kubeconfig or builds a TLS context.
"""

from __future__ import annotations

import inspect
import os
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

from kubernetes_asyncio.client import Configuration
from kubernetes_asyncio.config import ConfigException, load_kube_config
from kubernetes_asyncio.config.incluster_config import InClusterConfigLoader

from trtfleet.kube.errors import KubeConfigError

SERVICE_ACCOUNT_DIR: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
HOME_KUBECONFIG: Final = Path("~/.kube/config")
CONNECTION_POOL_SIZE: Final = 32
DEFAULT_NAMESPACE: Final = "default"


@dataclass(frozen=True)
class KubeSource:
    """Which credentials to load; :func:`load_connection` resolves it again on every (re)load, so a
    rotated token file or an exec plugin's new token is read afresh."""

    kubeconfig: str | None = None
    """One path or a ``:``-separated list; None: ``$KUBECONFIG``, in-cluster, ``~/.kube/config``."""
    context: str | None = None
    service_account_dir: Path = SERVICE_ACCOUNT_DIR
    environ: Mapping[str, str] | None = None
    """Environment to read ``KUBECONFIG``/``KUBERNETES_SERVICE_*`` from; None: ``os.environ``."""


@dataclass(frozen=True)
class KubeConnection:
    """A loaded library configuration and the namespace of the context (or service account)."""

    configuration: Configuration
    namespace: str
    in_cluster: bool


def _kubeconfig_paths(source: KubeSource, environ: Mapping[str, str]) -> str | None:
    if source.kubeconfig:
        return source.kubeconfig
    if environ.get("KUBECONFIG"):
        return environ["KUBECONFIG"]
    if environ.get("KUBERNETES_SERVICE_HOST") and (source.service_account_dir / "token").is_file():
        return None
    return str(HOME_KUBECONFIG.expanduser())


async def load_connection(source: KubeSource | None = None) -> KubeConnection:
    """Credentials and server from the library, as :class:`KubeSource` orders them."""
    source = source or KubeSource()
    environ = os.environ if source.environ is None else source.environ
    paths = _kubeconfig_paths(source, environ)
    configuration = Configuration()
    configuration.connection_pool_maxsize = CONNECTION_POOL_SIZE
    if paths is None:
        return _in_cluster(source.service_account_dir, environ, configuration)
    if not any(Path(path).expanduser().is_file() for path in paths.split(os.pathsep) if path):
        where = "" if source.kubeconfig or environ.get("KUBECONFIG") else " (and not in a cluster)"
        raise KubeConfigError(f"kubeconfig {paths}: no such file{where}")
    try:
        loader = await load_kube_config(
            config_file=paths, context=source.context, client_configuration=configuration, persist_config=False
        )
    except (ConfigException, OSError, KeyError, AssertionError) as exc:
        # The library asserts on a context or cluster that the kubeconfig does not have.
        raise KubeConfigError(f"kubeconfig {paths}: {exc!r}") from exc
    _finish(configuration)
    context = (loader.current_context or {}).get("context") or {}
    return KubeConnection(configuration, str(context.get("namespace") or DEFAULT_NAMESPACE), in_cluster=False)


def _in_cluster(account: Path, environ: Mapping[str, str], configuration: Configuration) -> KubeConnection:
    loader = InClusterConfigLoader(
        token_filename=str(account / "token"),
        cert_filename=str(account / "ca.crt"),
        try_refresh_token=True,
        environ=dict(environ),
    )
    try:
        loader.load_and_set(configuration)
    except (ConfigException, OSError) as exc:
        raise KubeConfigError(f"in-cluster service account {account}: {exc}") from exc
    _finish(configuration)
    namespace_file = account / "namespace"
    namespace = namespace_file.read_text().strip() if namespace_file.is_file() else DEFAULT_NAMESPACE
    return KubeConnection(configuration, namespace or DEFAULT_NAMESPACE, in_cluster=True)


def environment_proxy(server: str) -> str | None:
    """The ``HTTPS_PROXY``/``HTTP_PROXY`` for ``server`` unless ``NO_PROXY`` exempts it (as client-go)."""
    url = urlsplit(server)
    proxies = urllib.request.getproxies_environment()
    if not url.hostname or not proxies.get(url.scheme) or urllib.request.proxy_bypass(url.hostname):
        return None
    return proxies[url.scheme]


def _finish(configuration: Configuration) -> None:
    """What every load adds: a stripped token, and the proxy resolved once (a kubeconfig's
    ``proxy-url`` wins over the environment)."""
    _strip_token(configuration)
    if not configuration.proxy:
        configuration.proxy = environment_proxy(str(configuration.host))


def _strip_token(configuration: Configuration) -> None:
    """The library sends a token file's content as read, trailing newline included (which aiohttp
    refuses in a header); strip it now and after every refresh by the library's hook."""
    refresh = configuration.refresh_api_key_hook

    def strip(config: Configuration) -> None:
        if "BearerToken" in config.api_key:
            config.api_key["BearerToken"] = config.api_key["BearerToken"].strip()

    async def refresh_then_strip(config: Configuration, *args: object) -> None:
        if callable(refresh):
            result = refresh(config, *args)
            if inspect.isawaitable(result):
                await result
        strip(config)

    strip(configuration)
    if refresh is not None:
        configuration.refresh_api_key_hook = refresh_then_strip


async def bearer_token(configuration: Configuration) -> str | None:
    """The ``Authorization`` header value the library would send now (after its refresh hook)."""
    value = await configuration.get_api_key_with_prefix("BearerToken")
    return str(value) if value else None
