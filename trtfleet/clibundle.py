"""The ``trtfleet`` command as one self-contained directory, for pods that run NVIDIA's stock images.

Engine builds and quantizing prepares run in the TensorRT-LLM image a BaseModel names (any release), which
has no ``trtfleet``. trtfleet's own image carries this directory at :data:`BUNDLE_DIR`; an init container
copies it into an emptyDir of the pod and the job's container runs ``<mount>/bin/trtfleet`` from there.

Layout (relocatable: every path is found from the launcher's own location):

``python/``          a CPython of its own (python-build-standalone in ``images/trtfleet.Dockerfile``);
``site-packages/``   trtfleet and the distributions its jobs import, copied from the environment that builds it;
``lib/boot.py``      puts ``site-packages`` on the path and runs a module;
``bin/trtfleet``     ``python/bin/python3 -I -S lib/boot.py -m trtfleet ...``, with ``TRTFLEET_CLI`` exported;
``bin/trtfleet-python`` the same interpreter for ``-m MODULE`` (the prepare Job's entrypoint).

Why an interpreter of its own rather than a zipapp run by the image's ``python3``: the stock images' Python
differs by release (3.10 on the Ubuntu 22.04 Triton images, 3.12 on 24.04), trtfleet needs 3.11 or later, and
its compiled dependencies (pydantic-core, numpy, safetensors) are built for one Python version; a venv copied
from another image breaks for the same reasons. ``-I -S`` keeps the image's ``PYTHONPATH``, ``PYTHONHOME`` and
site-packages away from trtfleet while the environment passes unchanged to the tools it starts
(``trtllm-build``, the image's ``python3`` running ``convert_checkpoint.py`` or ModelOpt's ``hf_ptq.py``), so they
run exactly as they would without trtfleet. Steps that call ``trtfleet`` itself find it through ``TRTFLEET_CLI``.

    python -m trtfleet.clibundle --out DIR [--root DIST ...]

copies the running interpreter (its executable, shared library and standard library) and the import closure of
trtfleet's packages plus the ``--root`` distributions (default :data:`JOB_ROOTS`) and their requirements.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import importlib.util
import os
import re
import shutil
import stat
import sys
import sysconfig
from collections.abc import Iterable, Sequence
from pathlib import Path

BUNDLE_DIR = "/opt/trtfleet/cli"
"""Where trtfleet's image keeps the bundle (the init container copies it from here)."""
LAUNCHER = "bin/trtfleet"
PYTHON_LAUNCHER = "bin/trtfleet-python"
CLI_ENV = "TRTFLEET_CLI"
"""Set by the launcher to its own path: how a step that runs ``trtfleet`` finds this bundle's command."""
TRTFLEET_PACKAGES = ("trtfleet", "trtfleet_engines", "trtfleet_operator")
"""What build and prepare Jobs import of trtfleet (the router is not needed there)."""
JOB_ROOTS = ("pydantic", "PyYAML", "numpy", "safetensors", "huggingface_hub", "boto3")
"""Distributions the jobs import: the API models, plan files, tensors, hf:// and s3:// sources."""
STDLIB_SKIP = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "site-packages", "__pycache__"}

_BOOT = '''"""Runs a module with this bundle's site-packages, nothing of the image's Python (trtfleet.clibundle)."""
import os, runpy, site, sys

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
site.addsitedir(os.path.join(root, "site-packages"))
if len(sys.argv) < 3 or sys.argv[1] != "-m":
    sys.exit("usage: trtfleet-python -m MODULE [ARGS...]")
module = sys.argv[2]
sys.argv = [module, *sys.argv[3:]]
runpy.run_module(module, run_name="__main__", alter_sys=True)
'''

_LAUNCHER = '''#!/bin/sh
# trtfleet's own Python, isolated from the image's (trtfleet/clibundle.py).
here=$(CDPATH= cd -- "$(dirname -- "$0")/.." && pwd)
TRTFLEET_CLI="$here/{launcher}"
export TRTFLEET_CLI
exec "$here/python/bin/python3" -I -S "$here/lib/boot.py" {module}"$@"
'''


class BundleError(RuntimeError):
    """A distribution the bundle needs is not installed in the building environment."""


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_closure(roots: Iterable[str]) -> list[metadata.Distribution]:
    """The installed distributions ``roots`` need, with their requirements (extras and markers that do not
    apply to this interpreter left out); a missing root is a :class:`BundleError`."""
    seen: dict[str, metadata.Distribution] = {}
    todo = list(roots)
    while todo:
        name = _canonical(todo.pop())
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError as exc:
            raise BundleError(f"{name} is not installed where the bundle is built") from exc
        seen[name] = dist
        for requirement in dist.requires or ():
            spec, _, marker = requirement.partition(";")
            if marker and not _marker_holds(marker):
                continue
            todo.append(re.split(r"[\s\[<>=!~(]", spec.strip(), maxsplit=1)[0])
    return [seen[name] for name in sorted(seen)]


def _marker_holds(marker: str) -> bool:
    """Whether a requirement's environment marker applies: extras never do; a Python version bound or a
    platform test is evaluated by ``packaging`` when it is installed, else kept (copying one more is harmless)."""
    if "extra" in marker:
        return False
    try:
        from packaging.markers import Marker
    except ImportError:
        return True
    return bool(Marker(marker).evaluate())


def _copy_dist(dist: metadata.Distribution, site_packages: Path) -> None:
    base = Path(str(dist.locate_file("")))
    for file in dist.files or ():
        source = Path(str(dist.locate_file(file)))
        try:
            relative = source.resolve().relative_to(base.resolve())
        except ValueError:
            continue  # scripts in bin/ and the like: outside site-packages
        if relative.parts and relative.parts[0] == "..":
            continue
        if source.is_file():
            target = site_packages / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def _copy_package(name: str, site_packages: Path) -> None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise BundleError(f"package {name} is not importable where the bundle is built")
    source = Path(next(iter(spec.submodule_search_locations)))
    shutil.copytree(source, site_packages / name, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)


def _copy_interpreter(out: Path) -> None:
    """The running interpreter: its executable, its shared library if any, and its standard library."""
    prefix = Path(sys.base_prefix)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (out / "bin").mkdir(parents=True)
    executable = prefix / "bin" / version
    if not executable.exists():
        executable = Path(os.path.realpath(sys.executable))
    shutil.copy2(executable, out / "bin" / version)
    (out / "bin" / "python3").symlink_to(version)
    libdir = Path(str(sysconfig.get_config_var("LIBDIR") or prefix / "lib"))
    (out / "lib").mkdir()
    for library in libdir.glob(f"lib{version}*.so*"):
        shutil.copy2(library, out / "lib" / library.name, follow_symlinks=True)
    stdlib = Path(sysconfig.get_path("stdlib", vars={"installed_base": str(prefix), "base": str(prefix)}))
    shutil.copytree(stdlib, out / "lib" / version, symlinks=True,
                    ignore=lambda _dir, names: [n for n in names if n in STDLIB_SKIP])


def _write_executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def build_bundle(out: Path, roots: Sequence[str] = JOB_ROOTS) -> Path:
    """Write the bundle into ``out`` (which must not exist) from the running interpreter and environment."""
    if out.exists():
        raise BundleError(f"{out} exists: the bundle is written into a new directory")
    dists = requirement_closure(roots)
    site_packages = out / "site-packages"
    site_packages.mkdir(parents=True)
    for dist in dists:
        _copy_dist(dist, site_packages)
    for package in TRTFLEET_PACKAGES:
        _copy_package(package, site_packages)
    _copy_interpreter(out / "python")
    (out / "lib").mkdir()
    (out / "lib" / "boot.py").write_text(_BOOT)
    (out / "bin").mkdir()
    _write_executable(out / LAUNCHER, _LAUNCHER.format(launcher=LAUNCHER, module="-m trtfleet "))
    _write_executable(out / PYTHON_LAUNCHER, _LAUNCHER.format(launcher=LAUNCHER, module=""))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trtfleet.clibundle", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="a new directory to write the bundle into")
    parser.add_argument("--root", action="append", default=[], metavar="DIST",
                        help=f"a distribution the jobs import (repeatable; default {', '.join(JOB_ROOTS)})")
    args = parser.parse_args(argv)
    try:
        build_bundle(args.out, tuple(args.root) or JOB_ROOTS)
    except BundleError as exc:
        print(f"trtfleet.clibundle: {exc}", file=sys.stderr)
        return 2
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
