"""The package layout and the single entry point."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trtfleet.cli import COMMANDS, main
from trtfleet.version import __version__

ROOT = Path(__file__).resolve().parents[2]


def test_stdlib_operator_is_not_shadowed_from_the_repo_root() -> None:
    result = subprocess.run(
        [sys.executable, "-c", "import operator; print(operator.add(2, 3), operator.__file__)"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )
    value, path = result.stdout.split()
    assert value == "5" and not path.startswith(str(ROOT))


def test_version_and_every_subcommand_resolves() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "trtfleet", "--version"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == f"trtfleet {__version__}"
    assert set(COMMANDS) == {"operator", "router", "worker", "demo", "engines", "lora", "crds"}
    for name in COMMANDS:
        help_run = subprocess.run(
            [sys.executable, "-m", "trtfleet", name, "--help"], cwd=ROOT, capture_output=True, text=True
        )
        assert help_run.returncode == 0, f"trtfleet {name} --help: {help_run.stderr}"
        assert f"trtfleet {name}" in help_run.stdout


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    out = capsys.readouterr().out
    assert out.startswith("usage: trtfleet") and all(name in out for name in COMMANDS)
