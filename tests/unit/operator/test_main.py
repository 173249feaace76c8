"""kopf logs in with the connection the shared Kubernetes layer loaded."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from trtfleet_operator.main import connection_info

from trtfleet.kube import KubeSource, load_connection


def test_kopf_logs_in_with_what_the_shared_layer_loaded(tmp_path: Path) -> None:
    server = "https://10.0.0.1:6443"
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        json.dumps(
            {
                "current-context": "c",
                "clusters": [{"name": "k", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
                "users": [{"name": "u", "user": {"token": "t0k"}}],
                "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u", "namespace": "ns"}}],
            }
        )
    )
    connection = asyncio.run(load_connection(KubeSource(kubeconfig=str(kubeconfig), environ={})))
    info = asyncio.run(connection_info(connection))
    assert (info.server, info.scheme, info.token, info.insecure, info.default_namespace) == (
        "https://10.0.0.1:6443", "Bearer", "t0k", True, "ns"
    )
