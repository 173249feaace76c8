"""The collect Job's entrypoint: it removes inside its root only."""

from __future__ import annotations

from pathlib import Path

from trtfleet_operator.jobs import collect as collect_job


def test_collect_entrypoint_removes_inside_the_root_only(tmp_path: Path) -> None:
    (tmp_path / "abc" / "sub").mkdir(parents=True)
    (tmp_path / "abc" / "sub" / "f").write_text("x")
    (tmp_path / "checkpoints" / "h1").mkdir(parents=True)
    assert collect_job.main(["--root", str(tmp_path), "--remove", "abc", "--remove", "checkpoints/h1",
                             "--remove", "gone"]) == 0
    assert not (tmp_path / "abc").exists() and not (tmp_path / "checkpoints" / "h1").exists()
    assert (tmp_path / "checkpoints").is_dir()
    for bad in ("../x", "/etc", "a/../../x", "."):
        assert collect_job.main(["--root", str(tmp_path), "--remove", bad]) == collect_job.EXIT_BAD_PATH
