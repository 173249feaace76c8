"""The simulator's ``pytorch`` section: tiers from the PyTorch capacity plan, the rows it prints, its CLI wiring."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from trtfleet_engines.cli import load_basemodel
from trtfleet_engines.modeldims import resolve_dimensions
from trtfleet_engines.pytorch.capacity import plan_pytorch_capacity
from trtfleet_router.routing import policy_names

from bench import __main__ as bench_main
from bench import report, simbench_pytorch
from bench.simbench_pytorch import EXAMPLE, PlanError, PytorchTiers, plan_tiers, policy_rows, pytorch_fleet
from tests.unit.bench.test_bench_simulate import small_trace
from trtfleet.loracache import adapter_pages, spec_geometry


def test_tiers_are_the_capacity_plans_of_the_example() -> None:
    tiers = plan_tiers()
    spec = load_basemodel(str(EXAMPLE)).spec
    plan = plan_pytorch_capacity(spec)
    assert plan.lora is not None
    assert (tiers.max_cpu_loras, tiers.max_loras, tiers.kv_cache_tokens) == (
        plan.lora.max_cpu_loras, plan.lora.max_loras, plan.kv_cache_tokens)
    assert (tiers.max_batch_size, tiers.max_num_tokens) == (spec.engine.max_batch_size, spec.engine.max_num_tokens)
    assert (tiers.host_pages, tiers.device_pages) == (plan.lora.host.pages, plan.lora.device.pages)
    geometry = spec_geometry(spec, resolve_dimensions(spec).dims)
    assert tiers.adapter_pages == adapter_pages(geometry, simbench_pytorch.ADAPTER_RANK)
    assert 1 <= tiers.adapter_pages <= plan.lora.max_adapter_pages  # a rank-8 adapter: no more than a max-rank one


@pytest.mark.parametrize("slots", [False, True])
def test_fleet_takes_the_tiers_in_pages_or_in_adapters(slots: bool) -> None:
    tiers = plan_tiers()
    fleet = pytorch_fleet(4, tiers, slots=slots)
    expected = ((tiers.max_cpu_loras, tiers.max_loras, 1) if slots
                else (tiers.host_pages, tiers.device_pages, tiers.adapter_pages))
    assert (fleet.pod.host_pages, fleet.pod.device_pages, fleet.adapter_pages) == expected
    assert (fleet.pods, fleet.runtime, fleet.pod.kv_capacity_tokens) == (4, "pytorch", tiers.kv_cache_tokens)
    assert fleet.pod_read_bytes_per_s == simbench_pytorch.POD_READ_BYTES_PER_S
    assert fleet.pod.page_bytes * fleet.adapter_pages <= fleet.adapter_weights_bytes  # a copy moves the adapter


@pytest.mark.parametrize(("lora", "problem"), [
    ({"enabled": False}, "LoRA disabled"),
    ({"enabled": True, "maxRank": 64, "cache": {"hostMemoryBytes": 1024}}, "max_cpu_loras would be 0"),
])
def test_a_basemodel_without_usable_tiers_is_refused(tmp_path: Path, lora: dict[str, object], problem: str) -> None:
    document = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    document["spec"]["lora"] = lora
    path = tmp_path / "basemodel.yaml"
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    with pytest.raises(PlanError, match=problem):
        plan_tiers(path)


def test_rows_count_the_pods_reads_and_send_no_weights() -> None:
    tiers = PytorchTiers("small", max_cpu_loras=3, max_loras=2, host_pages=3, device_pages=2, adapter_pages=1,
                         kv_cache_tokens=100_000, max_batch_size=8, max_num_tokens=2048, max_lora_rank=64)
    spec = pytorch_fleet(3, tiers)
    rows, bound = policy_rows(small_trace(5), spec)
    assert [row["policy"] for row in rows] == list(policy_names())
    assert bound.capacity_slots == 3 * tiers.max_cpu_loras
    for row in rows:
        assert row["weights_bytes"] == 0 and row["misses"] == 0 and row["errors"] == 0
        assert row["pod_loads"] > 0
        assert row["read_gb"] == pytest.approx(row["pod_loads"] * spec.adapter_weights_bytes / 1e9)


@pytest.mark.parametrize(("runtime", "section"), [("pytorch", "sim-pytorch"), ("tensorrtllm", "sim")])
def test_runtime_picks_the_sim_section(monkeypatch: pytest.MonkeyPatch, runtime: str, section: str) -> None:
    from bench import simbench

    written: list[tuple[str, str]] = []
    monkeypatch.setattr(bench_main.signal, "signal", lambda *_args: None)  # keep pytest's own SIGTERM handler
    monkeypatch.setattr(report, "write_section", lambda key, body: written.append((key, body)))
    monkeypatch.setattr(report, "kept_calibration", lambda: None)
    monkeypatch.setattr(simbench_pytorch, "sim_section", lambda quick: f"pytorch quick={quick}")
    monkeypatch.setattr(simbench, "sim_section", lambda quick, calibration: f"tensorrt quick={quick}")
    assert bench_main.main(["--quick", "--only", "sim", "--runtime", runtime]) == 0
    assert written == [(section, f"{runtime.replace('llm', '')} quick=True")]


def test_kept_calibration_carries_the_earlier_runs_date_and_commit(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    body = ("Command: `x`. Machine: 2 x cpu, Python 3.11. Date: 2026-11-20. Commit: abc1234.\n\ntables\n\n"
            f"{report.CALIBRATION_HEAD} (text)\n\n| a |\n|---|\n| 1 |")
    report.write_section("sim", body, doc)
    kept = report.kept_calibration(doc)
    assert kept is not None and kept["text"].startswith(f"{report.CALIBRATION_HEAD} (text)\n\n| a |")
    assert kept["text"].endswith(", on 2026-11-20 at commit abc1234; the real runs were not repeated for this one._")
    report.write_section("sim", "Date: 2026-11-30. Commit: def5678.\n\n" + kept["text"], doc)
    assert report.kept_calibration(doc) == kept  # kept again: the note still names the run that made it
    report.write_section("sim", "no calibration", doc)
    assert report.kept_calibration(doc) is None
