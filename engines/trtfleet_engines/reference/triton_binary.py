"""Where the ``tritonserver`` of the ``nvidia-pytriton`` wheel lives, and how to run it on our repositories.

The wheel (Triton 2.51) holds ``pytriton/tritonserver/bin/tritonserver``, the Python backend
(``backends/python/{libtriton_python.so, triton_python_backend_utils.py}``), one Python backend stub per
Python version (``python_backend_stubs/<X.Y>/triton_python_backend_stub``) and its shared libraries
(``nvidia_pytriton.libs``). Pure helpers apart from :func:`locate_triton` (reads the installation) and
:func:`build_backends_dir` (writes symlinks). Errors: :class:`~trtfleet_engines.reference.errors.
TritonNotInstalledError`.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from trtfleet_engines.reference.errors import TritonNotInstalledError
from trtfleet_engines.reference.stubs import STUB_NAME, install_stub_recorder
from trtfleet_engines.reference.threads import one_blas_thread

EXIT_TIMEOUT_S = 5
"""tritonserver's wait for in-flight requests after SIGTERM (its default, 30 s, outlasts STOP_TIMEOUT_S)."""
SITE_DIRS_ENV = "TRTFLEET_WORKER_SITE_DIRS"
"""Environment variable naming the directories the Python models add to ``sys.path`` (see ``models/``)."""


@dataclass(frozen=True)
class TritonInstall:
    """Where the wheel's tritonserver pieces live."""

    server_binary: Path
    python_backend_dir: Path
    stub: Path
    libs_dir: Path


def locate_triton() -> TritonInstall:
    """Find tritonserver, the Python backend and the stub for the running Python in nvidia-pytriton."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise TritonNotInstalledError(
            "nvidia-pytriton is not installed: pip install 'trtfleet[reference]' (it ships tritonserver)"
        )
    package = Path(next(iter(spec.submodule_search_locations)))
    root = package / "tritonserver"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    install = TritonInstall(
        server_binary=root / "bin" / "tritonserver",
        python_backend_dir=root / "backends" / "python",
        stub=root / "python_backend_stubs" / version / "triton_python_backend_stub",
        libs_dir=package.parent / "nvidia_pytriton.libs",
    )
    for path in (install.server_binary, install.python_backend_dir, install.stub, install.libs_dir):
        if not path.exists():
            raise TritonNotInstalledError(f"nvidia-pytriton is incomplete: {path} is missing")
    return install


def build_backends_dir(install: TritonInstall, dest: Path, stub_log: Path | None = None) -> Path:
    """``dest/python/`` with the backend library, its utils module and this Python's stub (symlinks).

    With ``stub_log``, the stub is run through the recorder of :mod:`~trtfleet_engines.reference.stubs`,
    which logs how each stub process ended there.
    """
    python_dir = dest / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
        (python_dir / name).symlink_to(install.python_backend_dir / name)
    if stub_log is None:
        (python_dir / STUB_NAME).symlink_to(install.stub)
    else:
        install_stub_recorder(python_dir, install.stub, stub_log)
    return dest


def _import_roots() -> list[str]:
    """Directories that make this interpreter's packages importable in the stub (no .pth processing there)."""
    import trtfleet
    import trtfleet_engines

    roots = [str(Path(trtfleet_engines.__file__).resolve().parent.parent)]
    roots.append(str(Path(trtfleet.__file__).resolve().parent.parent))
    roots += [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    return list(dict.fromkeys(roots))


def worker_environment(install: TritonInstall, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for tritonserver: library path and the Python import path for the stub, one BLAS thread."""
    env = dict(os.environ if base is None else base)
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    lib_path = [p for p in (libdir, str(install.libs_dir), env.get("LD_LIBRARY_PATH", "")) if p]
    env["LD_LIBRARY_PATH"] = os.pathsep.join(lib_path)
    # The stub's embedded interpreter ignores PYTHONPATH: the models' bootstrap adds these with
    # site.addsitedir (which also runs .pth files, e.g. an editable install's finder).
    env[SITE_DIRS_ENV] = os.pathsep.join(_import_roots())
    env.setdefault("PYTHONUNBUFFERED", "1")
    one_blas_thread(env)  # the stubs' numpy: reference/threads.py
    return env


def tritonserver_command(
    install: TritonInstall,
    repo_dir: Path,
    backends_dir: Path,
    *,
    models: Sequence[str],
    host: str,
    http_port: int,
    grpc_port: int,
    metrics_port: int,
    log_verbose: int = 0,
) -> list[str]:
    """The tritonserver command line (explicit model control, loopback by default)."""
    command = [
        str(install.server_binary),
        f"--model-repository={repo_dir}",
        f"--backend-directory={backends_dir}",
        "--model-control-mode=explicit",
        "--disable-auto-complete-config",  # configs are complete: skip one stub start per Python model
        *[f"--load-model={name}" for name in models],
        "--strict-readiness=true",
        f"--exit-timeout-secs={EXIT_TIMEOUT_S}",
        "--exit-on-error=true",
        f"--http-address={host}",
        f"--http-port={http_port}",
        f"--grpc-address={host}",
        f"--grpc-port={grpc_port}",
        "--allow-metrics=true",
        "--allow-gpu-metrics=false",
        f"--metrics-address={host}",
        f"--metrics-port={metrics_port}",
        "--metrics-interval-ms=1000",
        f"--log-verbose={log_verbose}",
    ]
    return command
