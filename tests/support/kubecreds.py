"""Credential kinds users have, made against the test ControlPlane: ServiceAccount tokens that can be
revoked (bound to a Secret; deleting the Secret invalidates the token), a kubeconfig whose user is an
exec plugin (a script printing an ExecCredential with the token in a file, so the test can rotate it),
a kubeconfig with inline client-certificate data, and an in-cluster-style service-account directory."""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from tests.support.controlplane import ControlPlane, eventually

SERVICE_ACCOUNT = "trtfleet-creds"


@dataclass
class CredentialKit:
    cp: ControlPlane
    namespace: str
    root: Path

    @property
    def binding(self) -> str:
        return f"{self.namespace}-{SERVICE_ACCOUNT}"

    def __enter__(self) -> CredentialKit:
        self.cp.kubectl("create", "serviceaccount", SERVICE_ACCOUNT, "-n", self.namespace)
        self.cp.kubectl(
            "create", "clusterrolebinding", self.binding, "--clusterrole=cluster-admin",
            f"--serviceaccount={self.namespace}:{SERVICE_ACCOUNT}",
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self.cp.kubectl("delete", "clusterrolebinding", self.binding, "--ignore-not-found", check=False)

    # ------------------------------------------------------------------------------------ tokens
    def token(self, generation: int) -> str:
        """A token bound to Secret ``token-<generation>``: valid until :meth:`revoke` deletes it."""
        secret = f"token-{generation}"
        self.cp.kubectl("create", "secret", "generic", secret, "-n", self.namespace)
        return self.cp.kubectl(
            "create", "token", SERVICE_ACCOUNT, "-n", self.namespace, "--duration=1h",
            "--bound-object-kind=Secret", f"--bound-object-name={secret}",
        ).stdout.strip()

    def revoke(self, generation: int, token: str) -> None:
        """Delete the token's Secret and wait until the API server refuses the token."""
        self.cp.kubectl("delete", "secret", f"token-{generation}", "-n", self.namespace)
        eventually(lambda: self.status_with(token) == 401, timeout=30, what=f"token {generation} refused")

    def status_with(self, token: str) -> int:
        url = urlparse(self.cp.server)
        context = ssl.create_default_context(cafile=str(self.cp.pki / "ca.crt"))
        conn = http.client.HTTPSConnection(url.hostname or "", url.port, context=context, timeout=5)
        try:
            conn.request("GET", f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{SERVICE_ACCOUNT}",
                         headers={"Authorization": f"Bearer {token}"})
            return conn.getresponse().status
        finally:
            conn.close()

    # -------------------------------------------------------------------------------- kubeconfigs
    def _kubeconfig(self, name: str, user: dict[str, object], cluster: dict[str, object]) -> Path:
        path = self.root / name
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": self.cp.server, **cluster}}],
            "users": [{"name": "test", "user": user}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test", "namespace": self.namespace}}],
        }))
        path.chmod(0o600)
        return path

    def exec_kubeconfig(self, token_file: Path) -> Path:
        """A kubeconfig whose user runs a plugin that prints an ExecCredential with ``token_file``'s token."""
        plugin = self.root / "exec-plugin.py"
        plugin.write_text(
            "import json, pathlib, sys\n"
            f"token = pathlib.Path({str(token_file)!r}).read_text().strip()\n"
            "json.dump({'apiVersion': 'client.authentication.k8s.io/v1', 'kind': 'ExecCredential',"
            " 'status': {'token': token}}, sys.stdout)\n"
        )
        user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": sys.executable,
                         "args": [str(plugin)], "interactiveMode": "Never"}}
        return self._kubeconfig("exec.kubeconfig", user, {"certificate-authority": str(self.cp.pki / "ca.crt")})

    def client_cert_kubeconfig(self) -> Path:
        """The admin client certificate, key and the CA as inline ``*-data`` (the form clusters hand out)."""

        def data(name: str) -> str:
            return base64.b64encode((self.cp.pki / name).read_bytes()).decode()

        user = {"client-certificate-data": data("admin.crt"), "client-key-data": data("admin.key")}
        return self._kubeconfig("cert.kubeconfig", user, {"certificate-authority-data": data("ca.crt")})

    def service_account_dir(self, token: str) -> tuple[Path, dict[str, str]]:
        """``/var/run/secrets/kubernetes.io/serviceaccount`` as a pod sees it, and the pod's environment."""
        account = self.root / "serviceaccount"
        account.mkdir(exist_ok=True)
        (account / "ca.crt").write_bytes((self.cp.pki / "ca.crt").read_bytes())
        (account / "namespace").write_text(self.namespace)
        self.rotate(account, token)
        url = urlparse(self.cp.server)
        return account, {"KUBERNETES_SERVICE_HOST": url.hostname or "", "KUBERNETES_SERVICE_PORT": str(url.port)}

    @staticmethod
    def rotate(account: Path, token: str) -> None:
        """Replace the token the way the kubelet does: write aside, then rename over the old file."""
        staged = account / ".token.new"
        staged.write_text(token)
        staged.replace(account / "token")
