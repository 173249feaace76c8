"""Shared pytest configuration for trtfleet's test suite."""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import controlplane as cpmod
from tests.support.controlplane import GO_MISSING, ControlPlane, GoMissingError, eventually
from tests.support.tracebacks import serialise_caret_parsing

serialise_caret_parsing()

_SUITE_MARKERS = {"unit", "golden", "cluster", "integration", "e2e"}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Unmarked tests are unit tests (so `-m unit` selects them)."""
    for item in items:
        if not any(item.get_closest_marker(m) for m in _SUITE_MARKERS):
            item.add_marker(pytest.mark.unit)


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Under CI, a failure's report is written the moment it happens, not only in the summary after every test:
    a run of forty minutes is read while it goes on, and a run stopped early still says why its first test
    failed."""
    if not (_in_ci() and report.failed):
        return
    sys.stderr.write(f"\n---- {report.nodeid} failed ({report.when}), as it happened ----\n")
    sys.stderr.write(f"{report.longreprtext[-6000:]}\n")
    sections = [f"-- {name} --\n{text[-3000:]}" for name, text in report.sections if text.strip()]
    sys.stderr.write("\n".join(sections[-3:]) + "\n---- end of the failure's report ----\n")
    sys.stderr.flush()


_build_error: BaseException | None = None


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the control-plane binaries before any test runs (no per-test timeout
    applies here), but only when a selected test needs the control plane."""
    global _build_error
    if session.config.option.collectonly or cpmod.binaries_built() or cpmod.find_go() is None:
        return  # without Go the fixture skips (or fails under CI=true)
    if not any("control_plane" in getattr(item, "fixturenames", ()) for item in session.items):
        return
    # Minutes, once (cached outside the checkout); progress goes to the terminal.
    capman = session.config.pluginmanager.getplugin("capturemanager")
    try:
        if capman is None:
            cpmod.binaries()
        else:
            with capman.global_and_fixture_disabled():
                cpmod.binaries()
    except Exception as exc:  # reported by the fixture, test by test
        _build_error = exc


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """A real etcd + kube-apiserver + kube-controller-manager + kube-scheduler on
    loopback, with kwok simulating one node (``kwok-node-0``, 8 nvidia.com/gpu)
    so that Pods are scheduled and reach Running."""
    if _build_error is not None:
        raise RuntimeError(f"building the control plane failed: {_build_error}") from _build_error
    if not cpmod.binaries_built() and cpmod.find_go() is None:
        if _in_ci():
            raise GoMissingError(GO_MISSING)
        pytest.skip(GO_MISSING)
    cp = ControlPlane(kwok=True)
    cp.start()
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture
def kube_namespace(control_plane: ControlPlane) -> Iterator[str]:
    """A fresh namespace in the control plane, deleted afterwards."""
    name = f"t-{secrets.token_hex(4)}"
    control_plane.kubectl("create", "namespace", name)
    # Pods are rejected until the serviceaccount controller made "default".
    eventually(lambda: control_plane.kubectl("get", "serviceaccount", "default", "-n", name, check=False)
               .returncode == 0, timeout=30, what=f"ServiceAccount default in {name}")
    try:
        yield name
    finally:
        control_plane.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="rewrite tests/golden/**/expected from the current output (review the diff like code)",
    )


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    """True when golden files should be regenerated instead of compared."""
    return bool(request.config.getoption("--update-golden"))
