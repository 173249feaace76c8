"""The Helm chart, rendered by the real helm binary: lint, golden output, strict schema validation."""

from __future__ import annotations

import base64
import filecmp
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from trtfleet_router.metrics import RouterMetrics
from trtfleet_router.routing import parse_routing_config

from tests.support.helm import CHART, ROOT, helm

GOLDEN = ROOT / "tests" / "golden" / "chart"
CASES = {
    "default": [],
    "production": ["-f", str(CHART / "ci" / "production-values.yaml")],
    "gateway": ["-f", str(CHART / "ci" / "gateway-values.yaml")],
}
# Kinds of other projects' CRDs: checked for shape here, not by kubernetes-validate (it knows only built-ins).
FOREIGN_KINDS = {"ServiceMonitor", "ClusterKopfPeering", "PrometheusRule"}
K8S_VERSION = "1.35.0"


def _render(tmp_path: Path, args: list[str]) -> list[dict[str, object]]:
    out = helm("template", "trtfleet", str(CHART), "--namespace", "trtfleet-system", *args, home=tmp_path)
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


@pytest.mark.golden
def test_lint_is_clean(tmp_path: Path) -> None:
    for args in CASES.values():
        result = helm("lint", "--strict", str(CHART), *args, home=tmp_path, check=False)
        assert result.returncode == 0, result.stdout + result.stderr


GENERATED = "<48 random characters, generated once per release>"


def _generated_token(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with the internal token the chart generates (a new one at every ``helm template``) checked and
    replaced by :data:`GENERATED`, so the golden file stays put."""
    if doc["kind"] != "Secret" or doc["metadata"]["labels"].get("app.kubernetes.io/component") != "internal-auth":
        return doc
    token = base64.b64decode(doc["data"]["tokens"]).decode()
    assert re.fullmatch(r"[A-Za-z0-9]{48}\n", token), "one token of 48 random letters and digits"
    return {**doc, "data": {"tokens": GENERATED}}


@pytest.mark.golden
@pytest.mark.parametrize("case", sorted(CASES))
def test_template_golden(case: str, tmp_path: Path, update_golden: bool) -> None:
    docs = [_generated_token(doc) for doc in _render(tmp_path, CASES[case])]
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
                   "capacity_waiting_requests", "queue_wait_seconds_bucket", "queue_waiting_requests",
                   "tenant_served_tokens_total", "shed_requests_total"):
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


def _router(docs: list[dict[str, object]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The router Deployment's pod spec and its container."""
    (deployment,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "trtfleet-router"]  # type: ignore[index]
    pod = deployment["spec"]["template"]["spec"]  # type: ignore[index]
    return pod, pod["containers"][0]


@pytest.mark.golden
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_rendered_policy_file_is_one_the_router_starts_with(case: str, tmp_path: Path) -> None:
    """An unknown routing key stops the router at start-up, so the chart's file must parse (the production
    example once set ``loadBound``, which the router refuses)."""
    (config_map,) = [d for d in _render(tmp_path, CASES[case])
                     if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "trtfleet-router"]  # type: ignore[index]
    parsed = parse_routing_config(yaml.safe_load(config_map["data"]["policy.yaml"]))  # type: ignore[index]
    assert parsed.policy == "ttft-cost"


@pytest.mark.golden
def test_batches_are_off_by_default_and_a_store_turns_them_on(tmp_path: Path) -> None:
    _pod, container = _router(_render(tmp_path, []))
    assert not any(arg.startswith("--batch") for arg in container["args"])
    pod, container = _router(_render(tmp_path, ["--set", "router.batch.pvc=batches", "--set",
                                                "router.batch.podSlots=2", "--set", "router.batch.order=input",
                                                "--set", "router.batch.reservePods=auto"]))
    assert [a for a in container["args"] if a.startswith("--batch")] == [
        "--batch-store=/var/lib/trtfleet/batch", "--batch-pod-slots=2", "--batch-reserve-pods=auto",
        "--batch-order=input"]
    assert {"name": "batch-store", "mountPath": "/var/lib/trtfleet/batch"} in container["volumeMounts"]
    assert {"name": "batch-store", "persistentVolumeClaim": {"claimName": "batches"}} in pod["volumes"]
    _pod, container = _router(_render(tmp_path, CASES["production"]))
    assert [a for a in container["args"] if a.startswith("--batch")] == [
        "--batch-store=s3://llm-batches/prod", "--batch-pod-slots=2", "--batch-ttft-target-ms=500"]
    assert container["envFrom"] == [{"secretRef": {"name": "trtfleet-batch-s3"}}]


@pytest.mark.golden
@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"router": {"batch": {"store": "gs://bucket"}}}, "does not match"),
        ({"router": {"batch": {"podSlots": 0}}}, "minimum"),
        ({"router": {"batch": {"reservePods": -1}}}, "minimum: got -1"),
        ({"router": {"batch": {"reservePods": "some"}}}, "value must be 'auto'"),
        ({"router": {"batch": {"order": "fifo"}}}, "value must be one of"),
    ],
)
def test_schema_rejects_bad_batch_values(values: dict[str, object], message: str, tmp_path: Path) -> None:
    path = tmp_path / "values.json"
    path.write_text(json.dumps(values))
    result = helm("template", "t", str(CHART), "-f", str(path), home=tmp_path, check=False)
    assert result.returncode != 0 and message in result.stderr.lower(), result.stderr


@pytest.mark.golden
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_rendered_command_lines_are_ones_the_programs_accept(case: str, tmp_path: Path) -> None:
    """Each container's args through the program's own argument parser: helm renders large numbers as
    floats (``6.7108864e+07``), which ``--max-body-bytes`` (an int) refused, so the router never started."""
    import argparse
    import importlib

    from trtfleet.cli import COMMANDS

    deployments = [d for d in _render(tmp_path, CASES[case]) if d["kind"] == "Deployment"]
    assert len(deployments) == (3 if case == "gateway" else 2)  # the operator, the routers (, the pickers)
    for deployment in deployments:
        (container,) = deployment["spec"]["template"]["spec"]["containers"]  # type: ignore[index]
        command, *args = [a.replace("$(POD_IP)", "10.0.0.1") for a in container["args"]]
        parser = argparse.ArgumentParser(prog=f"trtfleet {command}", exit_on_error=False)
        importlib.import_module(COMMANDS[command].module).configure(parser)
        parsed = parser.parse_args(args)
        if command == "router":
            assert parsed.max_body_bytes == 64 * 1024 * 1024


def _policies(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """(namespace, name) -> spec of every NetworkPolicy."""
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    return {(d["metadata"]["namespace"], d["metadata"]["name"]): d["spec"] for d in policies}


def _component(component: str, namespace: str = "trtfleet-system") -> dict[str, Any]:
    labels = {"app.kubernetes.io/name": "trtfleet", "app.kubernetes.io/instance": "trtfleet",
              "app.kubernetes.io/component": component}
    return {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "podSelector": {"matchLabels": labels}}


def _rules(spec: dict[str, Any]) -> dict[tuple[str, ...], list[dict[str, Any]] | None]:
    """A policy's ingress rules: ports -> peers (None: from everywhere)."""
    return {tuple(str(p["port"]) for p in rule.get("ports", [])): rule.get("from") for rule in spec["ingress"]}


PROMETHEUS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}


@pytest.mark.golden
def test_network_policies_let_each_port_be_reached_only_by_whom_it_serves(tmp_path: Path) -> None:
    policies = _policies(_render(tmp_path, []))
    router, operator = _component("router"), _component("operator")
    assert set(policies) == {("trtfleet-system", f"trtfleet-{c}") for c in ("router", "operator", "serving")}
    assert _rules(policies[("trtfleet-system", "trtfleet-router")]) == {
        ("http", "grpc"): None,  # the clients: everyone (networkPolicy.clientsFrom narrows it)
        ("peers",): [router, operator],  # the other replicas; the operator's demand and held requests
        ("metrics",): [operator],  # the autoscaler; Prometheus once its namespace is named
    }
    assert policies[("trtfleet-system", "trtfleet-operator")]["ingress"] == []  # nobody, until Prometheus is named
    serving = policies[("trtfleet-system", "trtfleet-serving")]
    assert serving["podSelector"]["matchLabels"] == {  # what trtfleet_operator.builders put on serving pods
        "app.kubernetes.io/component": "serving", "app.kubernetes.io/managed-by": "trtfleet-operator",
        "app.kubernetes.io/part-of": "trtfleet"}
    assert _rules(serving) == {("http", "grpc", "metrics"): [router]}
    for spec in policies.values():
        assert spec["policyTypes"] == ["Ingress"]


@pytest.mark.golden
def test_network_policy_values_widen_only_what_they_name(tmp_path: Path) -> None:
    gateway = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway"}}}
    values = tmp_path / "values.json"
    values.write_text(json.dumps({
        "operator": {"watchNamespaces": ["llm-a", "llm-b"]},
        "networkPolicy": {"metricsNamespaces": ["monitoring"], "servingFrom": [gateway], "clientsFrom": [gateway]},
    }))
    policies = _policies(_render(tmp_path, ["-f", str(values)]))
    router, operator = _component("router"), _component("operator")
    assert _rules(policies[("trtfleet-system", "trtfleet-router")]) == {
        ("http", "grpc"): [gateway], ("peers",): [router, operator], ("metrics",): [operator, PROMETHEUS]}
    assert _rules(policies[("trtfleet-system", "trtfleet-operator")]) == {("metrics",): [PROMETHEUS]}
    for namespace in ("llm-a", "llm-b"):  # a policy wherever the operator runs serving pods
        assert _rules(policies[(namespace, "trtfleet-serving")]) == {
            ("http", "grpc", "metrics"): [router, gateway], ("metrics",): [PROMETHEUS]}
    assert ("trtfleet-system", "trtfleet-serving") not in policies
    assert not _policies(_render(tmp_path, ["--set", "networkPolicy.enabled=false"]))


@pytest.mark.golden
def test_the_internal_token_is_mounted_where_the_router_and_operator_read_it(tmp_path: Path) -> None:
    docs = _render(tmp_path, [])
    (secret,) = [d for d in docs if d["kind"] == "Secret"]
    assert secret["metadata"]["name"] == "trtfleet-internal"
    deployments = {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in docs if d["kind"] == "Deployment"}
    flags = {"trtfleet-router": "--internal-token-file=", "trtfleet-operator": "--router-token-file="}
    for name, flag in flags.items():
        pod = deployments[name]
        (container,) = pod["containers"]
        assert f"{flag}/etc/trtfleet/internal/tokens" in container["args"]
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "internal"]
        assert mount == {"name": "internal", "mountPath": "/etc/trtfleet/internal", "readOnly": True}  # no subPath
        (volume,) = [v for v in pod["volumes"] if v["name"] == "internal"]
        assert volume["secret"]["secretName"] == "trtfleet-internal"
    _pod, container = _router(docs)
    assert "--debug-endpoints" not in container["args"]
    given = _render(tmp_path, ["--set", "internalAuth.existingSecret=mine", "--set", "router.debugEndpoints=true"])
    assert not [d for d in given if d["kind"] == "Secret"]
    pod, container = _router(given)
    assert "--debug-endpoints" in container["args"]
    assert [v["secret"]["secretName"] for v in pod["volumes"] if v["name"] == "internal"] == ["mine"]


@pytest.mark.golden
@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"networkPolicy": {"metricsNamespaces": ["Not A Name"]}}, "does not match"),
        ({"networkPolicy": {"servingFrom": [{}]}}, "minproperties"),
        ({"internalAuth": {"token": "x"}}, "additional properties"),
    ],
)
def test_schema_rejects_bad_security_values(values: dict[str, object], message: str, tmp_path: Path) -> None:
    path = tmp_path / "values.json"
    path.write_text(json.dumps(values))
    result = helm("template", "t", str(CHART), "-f", str(path), home=tmp_path, check=False)
    assert result.returncode != 0 and message in result.stderr.lower(), result.stderr


ACCEPTED_FINDINGS = {
    ("KNP-011", "trtfleet-router"),  # the client ports: everyone, unless networkPolicy.clientsFrom names who
    ("KNP-010", "trtfleet-operator"),  # no ingress at all until Prometheus's namespace is named: intended
    ("KNP-030", ""),  # no namespace-wide default deny: the chart does not impose one on the user's namespaces
    ("KNP-031", ""),  # egress is not restricted (docs/security.md)
}


@pytest.mark.golden
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_network_policy_linter_finds_only_what_is_intended(case: str, tmp_path: Path) -> None:
    """kube-netpol (from PyPI) over the rendered chart: every finding is one of :data:`ACCEPTED_FINDINGS`,
    each explained in docs/security.md; a new one fails here."""
    manifests = tmp_path / "chart.yaml"
    manifests.write_text(yaml.safe_dump_all(_render(tmp_path, CASES[case])))
    report = tmp_path / "report.json"
    linter = Path(sys.executable).parent / "kube-netpol"
    subprocess.run([str(linter), "scan", str(manifests), "-f", "json", "-o", str(report)], check=True,
                   capture_output=True, timeout=120)
    issues = json.loads(report.read_text())["issues"]
    found = {(i["rule_id"], next(iter(re.findall(r"^Policy '([^']+)'", i["message"])), "")) for i in issues}
    assert found <= ACCEPTED_FINDINGS, sorted(found - ACCEPTED_FINDINGS)
    assert ("KNP-011", "trtfleet-router") in found  # the linter did read the policies


@pytest.mark.golden
def test_prometheus_rule_alerts_on_metrics_that_exist_and_renders_where_its_crd_is_served(tmp_path: Path) -> None:
    def rules(args: list[str]) -> list[dict[str, Any]]:
        docs = _render(tmp_path, args)
        return [d for d in docs if d["kind"] == "PrometheusRule"]  # type: ignore[misc]

    assert rules([]) == []  # auto, and this cluster serves no PrometheusRule kind
    assert rules(["--set", "metrics.prometheusRule.enabled=false", "--api-versions",
                  "monitoring.coreos.com/v1/PrometheusRule"]) == []
    [rule] = rules(["--api-versions", "monitoring.coreos.com/v1/PrometheusRule"])
    alerts = {r["alert"]: r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert {"TrtfleetPodsEjected", "TrtfleetColdLoadRateHigh", "TrtfleetRequestsHeld", "TrtfleetBuildFailures",
            "TrtfleetCapacityRefusals"} <= set(alerts)
    from prometheus_client import generate_latest
    from trtfleet_operator import metrics as operator_metrics

    exported = RouterMetrics().exposition().decode() + generate_latest(operator_metrics.REGISTRY).decode()
    families = {line.split()[2] for line in exported.splitlines() if line.startswith("# TYPE")}
    for name in set(re.findall(r"trtfleet_(?:router|operator)_[a-z_]+", " ".join(alerts.values()))):
        assert name in families or name.removesuffix("_total") in families, f"{name}: no such metric"


@pytest.mark.golden
def test_the_operator_gets_retention_and_drain_and_a_metrics_service(tmp_path: Path) -> None:
    docs = _render(tmp_path, ["--set", "operator.engineRetentionHours=0", "--set", "operator.adapterDrainSeconds=5"])
    [operator] = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "trtfleet-operator"]  # type: ignore[index]
    args = operator["spec"]["template"]["spec"]["containers"][0]["args"]  # type: ignore[index]
    assert "--engine-retention=0" in args and "--adapter-drain=5" in args
    [service] = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "trtfleet-operator-metrics"]  # type: ignore[index]
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"  # type: ignore[index]


@pytest.mark.golden
def test_artifact_pvcs_only_with_a_router_watching_the_release_namespace(tmp_path: Path) -> None:
    """The legacy runtimes' trap, made impossible: a PVC mounts only in its own namespace, so a router that reads
    pvc:// artifacts must serve the release namespace alone."""
    claim = ["--set", "router.artifactPvcs={trtfleet-adapters}"]
    for watched in ([], ["--set", "router.watchNamespaces={models}"],
                    ["--set", "router.watchNamespaces={trtfleet-system,models}"]):
        result = helm("template", "trtfleet", str(CHART), "--namespace", "trtfleet-system", *claim, *watched,
                      home=tmp_path, check=False)
        assert result.returncode != 0, watched
        assert "set router.watchNamespaces={trtfleet-system}" in result.stderr, result.stderr
    docs = _render(tmp_path, [*claim, "--set", "router.watchNamespaces={trtfleet-system}"])
    [router] = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "trtfleet-router"]  # type: ignore[index]
    claims = [v["persistentVolumeClaim"]["claimName"] for v in router["spec"]["template"]["spec"]["volumes"]  # type: ignore[index]
              if "persistentVolumeClaim" in v]
    assert claims == ["trtfleet-adapters"]


def _picker_objects(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``kind/name`` -> object, of the endpoint picker's objects (component epp)."""
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in docs
            if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "epp"}


def _operator_args(docs: list[dict[str, Any]]) -> list[str]:
    (operator,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "trtfleet-operator"]
    return list(operator["spec"]["template"]["spec"]["containers"][0]["args"])


@pytest.mark.golden
@pytest.mark.parametrize(
    ("args", "on"),
    [
        ([], False),  # off by default
        (["--set", "gateway.inferencePool.enabled=auto"], False),  # auto, and the cluster serves no InferencePool
        (["--set", "gateway.inferencePool.enabled=auto", "--api-versions",
          "inference.networking.k8s.io/v1/InferencePool"], True),
        (["--set", "gateway.inferencePool.enabled=true"], True),  # the operator then says CRDNotServed until it is
        (["--set", "gateway.inferencePool.enabled=false", "--api-versions",
          "inference.networking.k8s.io/v1/InferencePool"], False),
    ],
)
def test_the_picker_and_the_pools_follow_the_switch(args: list[str], on: bool, tmp_path: Path) -> None:
    docs = _render(tmp_path, args)
    picker = _picker_objects(docs)
    operator_args = _operator_args(docs)
    (operator_rules,) = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "trtfleet-operator"]
    pool_rules = [r for r in operator_rules["rules"] if "inferencepools" in r["resources"]]
    if not on:
        assert not picker and not pool_rules
        assert not any(a.startswith("--inference-pool-picker") for a in operator_args)
        return
    assert set(picker) == {"Deployment/trtfleet-epp", "Service/trtfleet-epp", "PodDisruptionBudget/trtfleet-epp",
                           "ServiceAccount/trtfleet-epp", "ClusterRole/trtfleet-epp", "ClusterRoleBinding/trtfleet-epp",
                           "NetworkPolicy/trtfleet-epp"}
    assert "--inference-pool-picker=trtfleet-epp:9002" in operator_args
    # only the verbs server-side apply needs; the garbage collector deletes a pool with its BaseModel
    assert pool_rules == [{"apiGroups": ["inference.networking.k8s.io"], "resources": ["inferencepools"],
                           "verbs": ["create", "patch"]}]


@pytest.mark.golden
def test_the_picker_is_a_router_process_on_the_picker_port_the_service_and_the_pools_name(tmp_path: Path) -> None:
    import argparse

    from trtfleet_router.cli import configure

    docs = _render(tmp_path, CASES["gateway"])
    picker = _picker_objects(docs)
    pod = picker["Deployment/trtfleet-epp"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    command, *args = [a.replace("$(POD_IP)", "10.0.0.1") for a in container["args"]]
    parser = argparse.ArgumentParser(exit_on_error=False)
    configure(parser)
    parsed = parser.parse_args(args)
    assert command == "router" and parsed.kubernetes
    assert (parsed.epp_port, parsed.epp_fallbacks, parsed.grpc_port) == (9002, 2, -1)  # no Triton gRPC front end
    assert parsed.policy_config == Path("/etc/trtfleet/policy.yaml")
    assert parsed.peer_dns == "trtfleet-router-peers.trtfleet-system.svc:8082"  # one shared view with the routers
    _router_pod, router = _router(docs)
    for flag in ("--kubernetes", "--policy-config=", "--max-body-bytes=", "--internal-token-file="):
        assert [a for a in router["args"] if a.startswith(flag)] == [a for a in container["args"] if a.startswith(flag)]
    assert {v["name"]: v for v in pod["volumes"]}["config"] == {"name": "config",
                                                                "configMap": {"name": "trtfleet-router"}}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"epp": 9002, "metrics": 9090, "peers": 8082}  # no http: the process binds it, nobody uses it
    assert container["readinessProbe"]["grpc"] == {"port": 9002, "service": "readiness"}
    assert container["livenessProbe"]["grpc"] == {"port": 9002, "service": "liveness"}
    (port,) = picker["Service/trtfleet-epp"]["spec"]["ports"]
    assert port == {"name": "epp", "port": 9002, "targetPort": "epp", "appProtocol": "http2"}
    assert "--inference-pool-picker=trtfleet-epp:9002" in _operator_args(docs)
    # the autoscaler and the merge advice read the pickers' demand too
    assert ("--router-selector=app.kubernetes.io/name=trtfleet,app.kubernetes.io/instance=trtfleet,"
            "app.kubernetes.io/component in (router,epp)") in _operator_args(docs)
    rules = picker["ClusterRole/trtfleet-epp"]["rules"]
    assert all(set(r["verbs"]) == {"get", "list", "watch"} for r in rules)  # reads the fleet, writes nothing
    assert {res for r in rules for res in r["resources"]} == {"endpointslices", "basemodels", "adapters"}


@pytest.mark.golden
def test_network_policies_let_only_the_gateway_reach_the_picker(tmp_path: Path) -> None:
    gateway = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway-system"}}}
    policies = _policies(_render(tmp_path, CASES["gateway"]))
    router, operator, picker = _component("router"), _component("operator"), _component("epp")
    assert _rules(policies[("trtfleet-system", "trtfleet-epp")]) == {
        ("epp",): [gateway],
        ("peers",): [router, picker, operator],
        ("metrics",): [operator],
    }
    assert _rules(policies[("trtfleet-system", "trtfleet-router")])[("peers",)] == [router, picker, operator]
    assert _rules(policies[("trtfleet-system", "trtfleet-serving")]) == {
        ("http", "grpc", "metrics"): [router, picker, gateway]}  # the gateway sends to the pod the picker chose
    unset = _policies(_render(tmp_path, ["--set", "gateway.inferencePool.enabled=true"]))
    assert ("epp",) not in _rules(unset[("trtfleet-system", "trtfleet-epp")])  # nobody until pickerFrom names one


@pytest.mark.golden
def test_a_picker_only_release_for_another_namespace(tmp_path: Path) -> None:
    """An InferencePool's picker Service must be in the pool's namespace: a release there with the picker alone."""
    docs = _render(tmp_path, ["--set", "gateway.inferencePool.enabled=true", "--set", "operator.enabled=false",
                              "--set", "router.enabled=false", "--set", "gateway.picker.service.name=llm-picker"])
    kinds = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in docs)
    assert "Deployment/trtfleet-router" not in kinds and "Deployment/trtfleet-operator" not in kinds
    assert {"Service/llm-picker", "Service/trtfleet-epp-peers", "ConfigMap/trtfleet-router",
            "Deployment/trtfleet-epp", "Secret/trtfleet-internal"} <= set(kinds)
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--peer-dns=trtfleet-epp-peers.trtfleet-system.svc:8082" in args  # the pickers find each other
    policies = _policies(docs)
    assert _rules(policies[("trtfleet-system", "trtfleet-epp")])[("peers",)] == [_component("epp")]


@pytest.mark.golden
@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"gateway": {"inferencePool": {"enabled": "yes"}}}, "value must be one of"),
        ({"gateway": {"picker": {"port": 0}}}, "minimum"),
        ({"gateway": {"picker": {"service": {"appProtocol": "h2"}}}}, "value must be one of"),
        ({"gateway": {"picker": {"service": {"name": "Picker"}}}}, "does not match"),
        ({"networkPolicy": {"pickerFrom": [{}]}}, "minproperties"),
    ],
)
def test_schema_rejects_bad_gateway_values(values: dict[str, object], message: str, tmp_path: Path) -> None:
    path = tmp_path / "values.json"
    path.write_text(json.dumps(values))
    result = helm("template", "t", str(CHART), "-f", str(path), home=tmp_path, check=False)
    assert result.returncode != 0 and message in result.stderr.lower(), result.stderr
