"""The Helm chart, rendered by the real helm binary: lint, golden output, strict schema validation."""

from __future__ import annotations

import filecmp
import json
import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from trtfleet_router.metrics import RouterMetrics

from tests.support.helm import CHART, ROOT, helm

GOLDEN = ROOT / "tests" / "golden" / "chart"
CASES = {"default": [], "production": ["-f", str(CHART / "ci" / "production-values.yaml")]}
# Kinds of other projects' CRDs: checked for shape here, not by kubernetes-validate (it knows only built-ins).
FOREIGN_KINDS = {"ServiceMonitor", "ClusterKopfPeering"}
K8S_VERSION = "1.35.0"


def _render(tmp_path: Path, args: list[str]) -> list[dict[str, object]]:
    out = helm("template", "trtfleet", str(CHART), "--namespace", "trtfleet-system", *args, home=tmp_path)
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


@pytest.mark.golden
def test_lint_is_clean(tmp_path: Path) -> None:
    for args in CASES.values():
        result = helm("lint", "--strict", str(CHART), *args, home=tmp_path, check=False)
        assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.golden
@pytest.mark.parametrize("case", sorted(CASES))
def test_template_golden(case: str, tmp_path: Path, update_golden: bool) -> None:
    docs = _render(tmp_path, CASES[case])
    expected_dir = GOLDEN / case / "expected"
    rendered = {f"{d['kind']}-{d['metadata']['name']}-{d['metadata'].get('namespace', '')}".rstrip("-")  # type: ignore[index]
                + ".yaml": yaml.safe_dump(d, sort_keys=True) for d in docs}
    if update_golden:
        expected_dir.mkdir(parents=True, exist_ok=True)
        for stale in expected_dir.glob("*.yaml"):
            stale.unlink()
        for name, text in rendered.items():
            (expected_dir / name).write_text(text)
    assert sorted(p.name for p in expected_dir.glob("*.yaml")) == sorted(rendered), "objects differ: --update-golden"
    for name, text in rendered.items():
        assert (expected_dir / name).read_text() == text, f"{case}/{name} differs; review and --update-golden"


@pytest.mark.golden
@pytest.mark.parametrize("case", sorted(CASES))
def test_manifests_validate_strictly(case: str, tmp_path: Path) -> None:
    for doc in _render(tmp_path, CASES[case]):
        if doc["kind"] in FOREIGN_KINDS:
            assert doc["apiVersion"] in {"monitoring.coreos.com/v1", "kopf.dev/v1"}
            continue
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.golden
def test_chart_crds_equal_generated_crds() -> None:
    names = sorted(p.name for p in (ROOT / "crds").glob("*.yaml"))
    assert names == sorted(p.name for p in (CHART / "crds").glob("*.yaml"))
    match, mismatch, errors = filecmp.cmpfiles(ROOT / "crds", CHART / "crds", names, shallow=False)
    assert not mismatch and not errors, f"charts/trtfleet/crds differs from crds/: {mismatch + errors}"


@pytest.mark.golden
@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"router": {"policy": "fastest"}}, "value must be one of"),
        ({"router": {"replicas": -1}}, "minimum"),
        ({"operator": {"replicas": 3}}, "maximum"),
        ({"routr": {}}, "additional properties"),
        ({"metrics": {"serviceMonitor": {"interval": "often"}}}, "pattern"),
        ({"router": {"peers": {"port": 0}}}, "minimum"),
    ],
)
def test_schema_rejects_bad_values(values: dict[str, object], message: str, tmp_path: Path) -> None:
    path = tmp_path / "values.json"
    path.write_text(json.dumps(values))
    result = helm("template", "t", str(CHART), "-f", str(path), home=tmp_path, check=False)
    assert result.returncode != 0
    assert message in result.stderr.lower() or message in result.stderr, result.stderr


def test_dashboard_queries_router_metrics() -> None:
    dashboard = json.loads((CHART / "dashboards" / "trtfleet.json").read_text())
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    for metric in ("time_to_first_token_seconds", "inter_token_latency_seconds", "output_tokens_total",
                   "adapter_cache_hits_total", "weight_bytes_sent_total", "inflight_requests",
                   "capacity_waiting_requests"):
        assert f"trtfleet_router_{metric}" in exprs
    # Every series the dashboard queries is one the router exports (no typo shows an empty panel).
    exported = RouterMetrics().exposition().decode()
    families = {line.split()[2] for line in exported.splitlines() if line.startswith("# TYPE")}
    for name in set(re.findall(r"trtfleet_router_[a-z_]+", exprs)):
        base = re.sub(r"_(bucket|sum|count)$", "", name) if "_seconds_" in name else name
        assert base in families or base.removesuffix("_total") in families, name


@pytest.mark.golden
def test_router_replicas_share_their_view_unless_peers_are_off(tmp_path: Path) -> None:
    def router_objects(args: list[str]) -> tuple[list[str], set[str]]:
        docs = _render(tmp_path, args)
        (deployment,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "trtfleet-router"]  # type: ignore[index]
        container = deployment["spec"]["template"]["spec"]["containers"][0]  # type: ignore[index]
        return list(container["args"]), {str(d["metadata"]["name"]) for d in docs if d["kind"] == "Service"}  # type: ignore[index]

    args, services = router_objects([])
    assert "--peer-dns=trtfleet-router-peers.trtfleet-system.svc:8082" in args
    assert "trtfleet-router-peers" in services
    args, services = router_objects(["--set", "router.peers.enabled=false"])
    assert "--peer-port=-1" in args and not any(a.startswith("--peer-dns") for a in args)
    assert "trtfleet-router-peers" not in services
