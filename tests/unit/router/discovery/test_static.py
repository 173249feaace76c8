"""Static discovery's translations: the fleet file and the flags into a snapshot (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from trtfleet_router.discovery.static import (
    StaticDiscovery,
    config_from_flags,
    load_fleet_config,
    snapshot_from_config,
)

from tests.unit.router.discovery.objects import ROOT
from tests.unit.router.harness import write_artifact


def test_fleet_file(tmp_path: Path) -> None:
    write_artifact(tmp_path / "adapters" / "upper")
    spec = yaml.safe_load((ROOT / "examples" / "basemodel-reference-tiny.yaml").read_text())["spec"]
    (tmp_path / "fleet.yaml").write_text(
        yaml.safe_dump(
            {
                "baseModels": [
                    {
                        "name": "tiny",
                        "spec": spec,
                        "hostPages": 3,
                        "backends": [
                            "10.0.0.1:8001/8002",
                            {"address": "10.0.0.2:8001", "podId": "w2", "metrics": "10.0.0.2:8002"},
                        ],
                        "adapters": [
                            {"servedName": "tiny-upper", "taskId": 4, "artifact": "adapters/upper", "minPods": 1}
                        ],
                    }
                ]
            }
        )
    )
    snapshot = StaticDiscovery(path=tmp_path / "fleet.yaml").initial()
    base = snapshot.registry.bases["tiny"]
    assert base.architecture == "reference" and base.host_pages == 3 and base.limits.max_input_tokens == 128
    adapter = snapshot.registry.adapters["tiny-upper"]
    assert adapter.artifact_uri == str(tmp_path / "adapters" / "upper") and adapter.weights_bytes == 128
    assert adapter.min_pods == 1 and adapter.pages >= 1
    pods = snapshot.pods["tiny"]
    assert pods["10.0.0.1:8001"].metrics_url == "http://10.0.0.1:8002/metrics"
    assert pods["w2"].address == "10.0.0.2:8001" and pods["w2"].uid == "10.0.0.2:8001"


def test_invalid_fleet_file(tmp_path: Path) -> None:
    (tmp_path / "fleet.yaml").write_text("baseModels: [{name: x, bogus: 1}]")
    with pytest.raises(ValueError, match="invalid fleet configuration"):
        load_fleet_config(tmp_path / "fleet.yaml")


def test_flags() -> None:
    config = config_from_flags(
        base_model="tiny",
        backends=["127.0.0.1:1/2,127.0.0.1:3"],
        adapters=["up=5:/data/up"],
        architecture="qwen2",
        max_input_len=10,
        max_seq_len=20,
        host_pages=None,
        device_pages=None,
        upstream_model="ensemble",
    )
    snapshot = snapshot_from_config(config)
    assert set(snapshot.pods["tiny"]) == {"127.0.0.1:1", "127.0.0.1:3"}
    assert snapshot.registry.bases["tiny"].upstream_model == "ensemble"
    assert snapshot.registry.resolve("up").adapter is not None
    with pytest.raises(ValueError, match="name=task_id:artifact_dir"):
        config_from_flags(
            base_model="t",
            backends=[],
            adapters=["bad"],
            architecture="llama",
            max_input_len=1,
            max_seq_len=2,
            host_pages=None,
            device_pages=None,
            upstream_model="m",
        )
