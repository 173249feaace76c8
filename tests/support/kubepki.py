"""The test control plane's PKI: a self-signed CA, the apiserver's serving certificate, client certificates
(admin, controller-manager, scheduler), the service-account key pair, and kubeconfigs that use them
(``openssl`` on PATH)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _ec_key(name: str, cwd: Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", name, cwd=cwd)


def make_pki(pki: Path) -> None:
    """Self-signed CA, apiserver serving cert, client certs and the SA key pair."""
    pki.mkdir(parents=True, exist_ok=True)
    _ec_key("ca.key", pki)
    _openssl(*"req -x509 -new -key ca.key -days 3650 -subj /CN=trtfleet-test-ca -out ca.crt".split(), cwd=pki)
    certs = {
        # name: (subject, extensions)
        "apiserver": ("/CN=kube-apiserver", "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,"
                      "IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default.svc\n"),
        "admin": ("/O=system:masters/CN=trtfleet-admin", "extendedKeyUsage=clientAuth\n"),
        "controller-manager": ("/CN=system:kube-controller-manager", "extendedKeyUsage=clientAuth\n"),
        "scheduler": ("/CN=system:kube-scheduler", "extendedKeyUsage=clientAuth\n"),
    }
    for name, (subject, ext) in certs.items():
        _ec_key(f"{name}.key", pki)
        (pki / f"{name}.ext").write_text("basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n" + ext)
        _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=pki)
        _openssl(*f"x509 -req -in {name}.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 "
                   f"-extfile {name}.ext -out {name}.crt".split(), cwd=pki)
    _ec_key("sa.key", pki)
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
    for p in pki.iterdir():
        if p.suffix == ".key":
            p.chmod(0o600)


def write_kubeconfig(path: Path, server: str, pki: Path, user: str) -> None:
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: trtfleet-test\n  cluster:\n    server: {server}\n"
        f"    certificate-authority: {pki / 'ca.crt'}\n"
        f"users:\n- name: {user}\n  user:\n    client-certificate: {pki / (user + '.crt')}\n"
        f"    client-key: {pki / (user + '.key')}\n"
        f"contexts:\n- name: trtfleet-test\n  context:\n    cluster: trtfleet-test\n    user: {user}\n"
        "current-context: trtfleet-test\n"
    )
    path.chmod(0o600)
