"""``trtfleet engines``: outputs, exit codes and one-line-per-problem error reporting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from trtfleet_engines.plan import engine_hash

from trtfleet.api import BaseModel
from trtfleet.cli import main

ROOT = Path(__file__).resolve().parents[3]
LLAMA = ROOT / "examples" / "basemodel-llama3-8b-tensorrtllm.yaml"
TINY = ROOT / "examples" / "basemodel-reference-tiny.yaml"


def _write(tmp_path: Path, doc: object, name: str = "bm.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def _spec_of(path: Path) -> BaseModel:
    return BaseModel.model_validate(yaml.safe_load(path.read_text()))


def test_plan_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["engines", "plan", "-f", str(LLAMA), "--workdir", "/scratch"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["engineHash"] == engine_hash(_spec_of(LLAMA).spec)
    assert plan["workdir"] == "/scratch"
    assert [s["name"] for s in plan["steps"]] == ["fetch", "convert-checkpoint", "trtllm-build", "stage"]


def test_plan_merged_adapter(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            ["engines", "plan", "-f", str(LLAMA), "--merged-adapter", "hf://org/a", "--adapter-revision", "r"]
        )
        == 0
    )
    plan = json.loads(capsys.readouterr().out)
    assert plan["mergedAdapter"] == {"uri": "hf://org/a", "revision": "r"}
    assert plan["engineHash"] != engine_hash(_spec_of(LLAMA).spec)


def test_hash(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["engines", "hash", "-f", str(TINY)]) == 0
    full = capsys.readouterr().out.strip()
    assert full == engine_hash(_spec_of(TINY).spec)
    assert main(["engines", "hash", "-f", str(TINY), "--short"]) == 0
    assert capsys.readouterr().out.strip() == full[:16]


def test_capacity_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["engines", "capacity", "-f", str(LLAMA)]) == 0
    out = capsys.readouterr().out
    assert "verdict: ok" in out and "LoRA host tier" in out and "11 rank-64 or 46 rank-16 adapters" in out
    assert main(["engines", "capacity", "-f", str(LLAMA), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == "ok" and data["status"]["loraHostAdapters"] == 11


def test_capacity_that_does_not_fit_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = yaml.safe_load(LLAMA.read_text())
    doc["spec"]["source"]["uri"] = "hf://meta-llama/Llama-3.3-70B-Instruct"
    assert main(["engines", "capacity", "-f", _write(tmp_path, doc), "--gpu", "A100-80GB"]) == 1
    captured = capsys.readouterr()
    assert "verdict: error" in captured.out
    assert captured.err.startswith("error: weights need") and "Traceback" not in captured.err


def test_capacity_with_a_config_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert main(["engines", "capacity", "-f", str(LLAMA), "--config-json", str(tmp_path)]) == 0
    assert "dimensions from config.json" in capsys.readouterr().out


def test_invalid_spec_one_line_per_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = yaml.safe_load(LLAMA.read_text())
    doc["spec"]["lora"]["maxRank"] = 3
    doc["spec"]["serving"]["replicas"] = -1
    doc["spec"]["bogus"] = True
    path = _write(tmp_path, doc)
    assert main(["engines", "plan", "-f", path]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith(f"error: {path}: spec.") for line in err)
    assert any("spec.lora: lora.maxRank must be a power of two" in line for line in err)
    assert any("spec.serving.replicas: Input should be greater than or equal to 0" in line for line in err)
    assert any("spec.bogus: Extra inputs are not permitted" in line for line in err)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "No such file"),
        ("a: [", "not valid YAML"),
        ("kind: Adapter\n", "no object with kind: BaseModel"),
    ],
)
def test_unreadable_input_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, message: str
) -> None:
    path = tmp_path / "x.yaml"
    if content is not None:
        path.write_text(content)
    assert main(["engines", "hash", "-f", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_unsupported_spec_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = yaml.safe_load(LLAMA.read_text())
    doc["spec"]["engine"]["gpu"]["product"] = "A100-80GB"
    doc["spec"]["quantization"]["mode"] = "fp8"
    assert main(["engines", "plan", "-f", _write(tmp_path, doc)]) == 2
    assert "needs a GPU with fp8" in capsys.readouterr().err
    assert main(["engines", "capacity", "-f", str(LLAMA), "--gpu", "TPU"]) == 2
    assert "is not a GPU trtfleet knows" in capsys.readouterr().err


def test_render_repo(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "repo"
    assert (
        main(["engines", "render-repo", "-f", str(TINY), "--engine-dir", "/models/tiny", "--out", str(out)])
        == 0
    )
    printed = capsys.readouterr().out.split()
    assert len(printed) == 5 and all(Path(p).is_file() for p in printed)
    text = (out / "tensorrt_llm" / "config.pbtxt").read_text()
    assert 'backend: "python"' in text and '"/models/tiny"' in text


def test_build_with_a_bad_plan_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "plan.json"
    bad.write_text("{not json")
    assert main(["engines", "build", "--plan", str(bad), "--out", str(tmp_path / "out")]) == 2
    assert "not JSON" in capsys.readouterr().err
    bad.write_text(json.dumps({"formatVersion": 0}))
    assert main(["engines", "build", "--plan", str(bad), "--out", str(tmp_path / "out")]) == 2
    assert "formatVersion" in capsys.readouterr().err
