"""Locating the wheel's tritonserver and the command line / environment it runs with."""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

from trtfleet_engines.reference.triton_binary import (
    SITE_DIRS_ENV,
    build_backends_dir,
    locate_triton,
    tritonserver_command,
    worker_environment,
)


def test_the_wheel_has_everything_for_this_python(tmp_path: Path) -> None:
    install = locate_triton()
    assert install.stub.parent.name == f"{sys.version_info.major}.{sys.version_info.minor}"
    backends = build_backends_dir(install, tmp_path / "backends")
    assert sorted(p.name for p in (backends / "python").iterdir()) == [
        "libtriton_python.so",
        "triton_python_backend_stub",
        "triton_python_backend_utils.py",
    ]
    assert all(p.resolve().is_file() for p in (backends / "python").iterdir())


def test_environment_puts_this_pythons_libdir_first() -> None:
    install = locate_triton()
    env = worker_environment(install, {"LD_LIBRARY_PATH": "/elsewhere"})
    paths = env["LD_LIBRARY_PATH"].split(":")
    assert paths == [sysconfig.get_config_var("LIBDIR"), str(install.libs_dir), "/elsewhere"]
    import trtfleet_engines

    assert str(Path(trtfleet_engines.__file__).resolve().parent.parent) in env[SITE_DIRS_ENV].split(":")


def test_environment_gives_the_stubs_numpy_one_blas_thread_unless_told_otherwise() -> None:
    install = locate_triton()
    env = worker_environment(install, {})
    assert env["OPENBLAS_NUM_THREADS"] == "1" and env["OMP_NUM_THREADS"] == "1"
    assert worker_environment(install, {"OPENBLAS_NUM_THREADS": "4"})["OPENBLAS_NUM_THREADS"] == "4"


def test_command_uses_explicit_model_control_on_the_given_ports(tmp_path: Path) -> None:
    command = tritonserver_command(
        locate_triton(),
        tmp_path / "repo",
        tmp_path / "backends",
        models=["ensemble", "tensorrt_llm"],
        host="127.0.0.1",
        http_port=1,
        grpc_port=2,
        metrics_port=3,
    )
    assert "--model-control-mode=explicit" in command
    assert ["--load-model=ensemble", "--load-model=tensorrt_llm"] == [c for c in command if "load-model" in c]
    assert {"--http-port=1", "--grpc-port=2", "--metrics-port=3", "--disable-auto-complete-config"} <= set(command)
