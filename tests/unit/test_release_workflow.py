"""The release workflow publishes what the chart's defaults name (make lint runs actionlint on it)."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = yaml.safe_load((ROOT / ".github" / "workflows" / "release.yaml").read_text())
VALUES = yaml.safe_load((ROOT / "charts" / "trtfleet" / "values.yaml").read_text())


def test_every_image_the_chart_defaults_to_is_published() -> None:
    published = set(WORKFLOW["jobs"]["images"]["strategy"]["matrix"]["image"])
    assert published == {"trtfleet", "reference-worker"}
    assert all((ROOT / "images" / f"{name}.Dockerfile").is_file() for name in published)
    defaults = {VALUES["image"]["repository"].rsplit("/", 1)[1], VALUES["operator"]["images"]["worker"].split("/")[-1]
                .split(":")[0]}
    assert defaults == published


def test_releases_on_version_tags_and_pushes_the_chart_after_the_images() -> None:
    trigger = WORKFLOW[True] if True in WORKFLOW else WORKFLOW["on"]  # YAML 1.1 reads the key `on` as True
    assert trigger["push"]["tags"] == ["v*.*.*"]
    assert set(WORKFLOW["jobs"]["chart"]["needs"]) == {"version", "images"}
    assert "helm push" in WORKFLOW["jobs"]["chart"]["steps"][-1]["run"]
