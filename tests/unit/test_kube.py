"""The shared Kubernetes layer without a server: which source :func:`load_connection` picks, what the
library loads from each credential kind, and how error answers read. The cluster tests
(tests/cluster/test_kube_credentials.py) run the same kinds against a real API server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from trtfleet.kube import KubeApi, KubeApiError, KubeConfigError, KubeSource, load_connection
from trtfleet.kube.client import api_error
from trtfleet.kube.config import bearer_token, environment_proxy

SERVER = "https://10.0.0.1:6443"


def kubeconfig(path: Path, user: dict[str, Any], *, namespace: str | None = "ns", context: str = "c") -> Path:
    ctx: dict[str, Any] = {"cluster": "k", "user": "u"}
    if namespace:
        ctx["namespace"] = namespace
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": context,
                "clusters": [{"name": "k", "cluster": {"server": SERVER + "/", "insecure-skip-tls-verify": True}}],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "c", "context": ctx}, {"name": "other", "context": {**ctx, "namespace": "o"}}],
            }
        )
    )
    return path


def exec_plugin(tmp_path: Path, token: str) -> dict[str, Any]:
    script = tmp_path / "plugin.py"
    credential = {"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential", "status": {"token": token}}
    script.write_text(f"import json\nprint(json.dumps({credential!r}))\n")
    return {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": [str(script)],
            "interactiveMode": "Never",
        }
    }


def service_account(tmp_path: Path, token: str) -> Path:
    account = tmp_path / "sa"
    account.mkdir(exist_ok=True)
    (account / "token").write_text(token)
    (account / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    (account / "namespace").write_text("sa-ns\n")
    return account


@dataclass(frozen=True)
class Case:
    id: str
    user: dict[str, Any]
    context: str | None
    want_header: str
    want_namespace: str


def cases(tmp_path: Path) -> list[Case]:
    (tmp_path / "token-file").write_text("from-file\n")
    return [
        Case("token", {"token": "t0k"}, None, "Bearer t0k", "ns"),
        Case("token file", {"tokenFile": str(tmp_path / "token-file")}, None, "Bearer from-file", "ns"),
        Case("exec plugin", exec_plugin(tmp_path, "from-plugin"), None, "Bearer from-plugin", "ns"),
        Case("named context", {"token": "t0k"}, "other", "Bearer t0k", "o"),
    ]


@pytest.mark.parametrize("index", range(4), ids=["token", "token-file", "exec-plugin", "named-context"])
def test_kubeconfig_credentials_come_from_the_library(tmp_path: Path, index: int) -> None:
    case = cases(tmp_path)[index]
    path = kubeconfig(tmp_path / "config", case.user)

    async def load() -> tuple[str | None, str | None, str]:
        connection = await load_connection(KubeSource(kubeconfig=str(path), context=case.context, environ={}))
        return connection.configuration.host, await bearer_token(connection.configuration), connection.namespace

    assert asyncio.run(load()) == (SERVER, case.want_header, case.want_namespace), case.id


def test_in_cluster_when_the_environment_says_so_and_the_token_is_reread(tmp_path: Path) -> None:
    account = service_account(tmp_path, "first")
    environ = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    source = KubeSource(service_account_dir=account, environ=environ)

    async def load() -> tuple[str | None, str | None, str, bool]:
        connection = await load_connection(source)
        configuration = connection.configuration
        return configuration.host, await bearer_token(configuration), connection.namespace, connection.in_cluster

    assert asyncio.run(load()) == ("https://10.96.0.1:443", "Bearer first", "sa-ns", True)
    (account / "token").write_text("second")
    assert asyncio.run(load())[1] == "Bearer second"


def test_kubeconfig_env_wins_over_the_service_account(tmp_path: Path) -> None:
    account = service_account(tmp_path, "sa-token")
    path = kubeconfig(tmp_path / "config", {"token": "kc-token"})
    environ = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443", "KUBECONFIG": str(path)}
    connection = asyncio.run(load_connection(KubeSource(service_account_dir=account, environ=environ)))
    assert (connection.in_cluster, connection.namespace) == (False, "ns")


@pytest.mark.parametrize(
    ("what", "context"),
    [pytest.param("missing file", None, id="missing-file"), pytest.param("unknown context", "nope", id="context")],
)
def test_unusable_kubeconfig_is_a_config_error(tmp_path: Path, what: str, context: str | None) -> None:
    path = tmp_path / "absent" if what == "missing file" else kubeconfig(tmp_path / "config", {"token": "t"})
    with pytest.raises(KubeConfigError, match="no such file" if what == "missing file" else "kubeconfig"):
        asyncio.run(load_connection(KubeSource(kubeconfig=str(path), context=context, environ={})))


def test_failing_exec_plugin_is_a_config_error(tmp_path: Path) -> None:
    user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "false"}}
    path = kubeconfig(tmp_path / "config", user)
    with pytest.raises(KubeConfigError):
        asyncio.run(load_connection(KubeSource(kubeconfig=str(path), environ={})))


@pytest.mark.parametrize(
    ("body", "want"),
    [
        pytest.param(
            b'{"kind":"Status","reason":"Conflict","message":"changed"}', (409, "Conflict", "changed"), id="status"
        ),
        pytest.param(b"<html>proxy error</html>", (409, "Fallback", "<html>proxy error</html>"), id="not-json"),
        pytest.param(b"", (409, "Fallback", ""), id="empty"),
    ],
)
def test_api_error_reads_the_status_object(body: bytes, want: tuple[int, str, str]) -> None:
    error = api_error(409, body, "Fallback")
    assert (error.status, error.reason, error.message) == want


@pytest.mark.parametrize(
    ("env", "want"),
    [
        pytest.param({}, None, id="none"),
        pytest.param({"HTTPS_PROXY": "http://proxy:3128"}, "http://proxy:3128", id="https-proxy"),
        pytest.param({"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": "10.0.0.1"}, None, id="no-proxy"),
        pytest.param({"HTTP_PROXY": "http://proxy:3128"}, None, id="http-proxy-only"),
    ],
)
def test_environment_proxy_is_resolved_once_per_load(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], want: str | None
) -> None:
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert environment_proxy(SERVER) == want


class TokenServer:
    """A real local HTTP server that accepts one bearer token (401 otherwise) and counts what it saw."""

    def __init__(self, accepted: str) -> None:
        self.accepted = accepted
        self.seen: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append(request.headers.get("Authorization", ""))
        if request.headers.get("Authorization") != f"Bearer {self.accepted}":
            return web.json_response({"kind": "Status", "reason": "Unauthorized", "message": "no"}, status=401)
        return web.json_response({"kind": "Namespace", "metadata": {"name": "ns"}})

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[str]:
        app = web.Application()
        app.router.add_get("/{tail:.*}", self.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            await runner.cleanup()


def plugin_kubeconfig(tmp_path: Path, server: str, token_file: Path) -> Path:
    """An exec plugin that prints the token in ``token_file``, and fails once that file is gone."""
    script = tmp_path / "plugin.py"
    script.write_text(
        "import json, pathlib, sys\n"
        f"token = pathlib.Path({str(token_file)!r}).read_text().strip()\n"
        "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1', 'kind': 'ExecCredential',"
        " 'status': {'token': token}}))\n"
    )
    user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": sys.executable, "args": [str(script)]}}
    path = tmp_path / "config"
    path.write_text(
        json.dumps(
            {
                "current-context": "c",
                "clusters": [{"name": "k", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
            }
        )
    )
    return path


def test_a_401_runs_the_exec_plugin_again_once_and_retries(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("old")
    server = TokenServer(accepted="old")

    async def scenario() -> tuple[list[str], int, int]:
        async with server.running() as url:
            source = KubeSource(kubeconfig=str(plugin_kubeconfig(tmp_path, url, token_file)), environ={})
            async with await KubeApi.connect(source) as api:
                await api.request("GET", "/api/v1/namespaces/ns")
                token_file.write_text("new")
                server.accepted = "new"  # the old token is refused from now on
                await api.request("GET", "/api/v1/namespaces/ns")
                reloads = api.reloads
                token_file.unlink()  # the plugin fails from now on
                server.accepted = "newer"
                with pytest.raises(KubeApiError) as refused:
                    await api.request("GET", "/api/v1/namespaces/ns")
                return server.seen, reloads, refused.value.status

    seen, reloads, status = asyncio.run(scenario())
    assert seen == ["Bearer old", "Bearer old", "Bearer new", "Bearer new"]
    assert (reloads, status) == (1, 401), "one reload per 401; a failing plugin leaves the 401"
