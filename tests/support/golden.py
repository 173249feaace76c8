"""Golden directories: compare rendered files with ``<case>/expected/``, or rewrite them under ``--update-golden``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def check_golden_dir(expected_dir: Path, files: Mapping[str, str], *, update: bool, case: str) -> None:
    """Assert ``expected_dir`` holds exactly ``files``; with ``update`` rewrite it instead (stale files removed)."""
    if update:
        expected_dir.mkdir(exist_ok=True)
        for stale in expected_dir.iterdir():
            if stale.name not in files:
                stale.unlink()
        for name, text in files.items():
            (expected_dir / name).write_text(text)
        return
    assert expected_dir.is_dir(), f"no golden files for {case}: run pytest --update-golden"
    assert sorted(p.name for p in expected_dir.iterdir()) == sorted(files)
    for name, text in files.items():
        got = (expected_dir / name).read_text()
        assert got == text, f"{case}/expected/{name} differs: review, then --update-golden"
