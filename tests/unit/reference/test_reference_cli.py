"""``trtfleet worker`` arguments, as the operator and the demo pass them."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from trtfleet_engines.reference.cli import _load_spec, configure, run
from trtfleet_engines.reference.repository import DEFAULT_REFERENCE_SPEC, default_reference_spec


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    configure(parser)
    return parser.parse_args(argv)


def test_operator_arguments_parse() -> None:
    args = _parse(
        "--spec",
        "/etc/trtfleet/basemodel.json",
        "--model-dir",
        "/opt/trtfleet/models/tiny-llama",
        "--host",
        "0.0.0.0",
        "--http-port",
        "8000",
        "--grpc-port",
        "8001",
        "--metrics-port",
        "8002",
        "--min-step-ms",
        "2",
    )
    assert args.model == Path("/opt/trtfleet/models/tiny-llama") and args.spec == Path("/etc/trtfleet/basemodel.json")
    assert (args.http_port, args.grpc_port, args.metrics_port, args.min_step_ms) == (8000, 8001, 8002, 2.0)
    assert args.func is run


def test_spec_file_may_be_a_bare_spec_or_a_whole_basemodel(tmp_path: Path) -> None:
    bare = tmp_path / "basemodel.json"
    bare.write_text(default_reference_spec().model_dump_json(by_alias=True, exclude_none=True))
    whole = tmp_path / "basemodel.yaml"
    whole.write_text(
        json.dumps(
            {
                "apiVersion": "trtfleet.io/v1alpha1",
                "kind": "BaseModel",
                "metadata": {"name": "tiny"},
                "spec": dict(DEFAULT_REFERENCE_SPEC),
            }
        )
    )
    assert _load_spec(bare) == _load_spec(whole) == default_reference_spec()
    assert _load_spec(None) is None


def test_an_unusable_model_dir_exits_1_and_leaves_nothing(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    before = set(Path(tempfile.gettempdir()).glob("trtfleet-worker-repo-*"))
    code = run(_parse("--model-dir", str(tmp_path), "--http-port", "1", "--grpc-port", "2", "--metrics-port", "3"))
    assert code == 1
    assert "not a reference model directory" in capsys.readouterr().err
    assert set(Path(tempfile.gettempdir()).glob("trtfleet-worker-repo-*")) == before


def test_pytorch_runtime_becomes_the_reference_trtllm_serve_command_line() -> None:
    from trtfleet_engines.reference.cli import serve_argv
    from trtfleet_engines.reference.serve.settings import settings_from_args

    args = _parse("--runtime", "pytorch", "--host", "127.0.0.1", "--http-port", "8123", "--served-model-name",
                  "tiny", "--max-loras", "1", "--max-cpu-loras", "3", "--min-step-ms", "5", "--kv-tokens-per-block",
                  "16", "--kv-block-reuse", "false", "--kv-event-buffer-max-size", "10", "--prefill-us-per-token", "40")
    argv = serve_argv(args, Path("/tmp/options.yaml"))
    assert argv == ["--host", "127.0.0.1", "--port", "8123", "--config", "/tmp/options.yaml",
                    "--served_model_name", "tiny", "--min-step-ms", "5.0", "--prefill-us-per-token", "40.0",
                    "--max-loras", "1", "--max-cpu-loras", "3",
                    "--kv-tokens-per-block", "16", "--kv-block-reuse", "false", "--kv-event-buffer-max-size", "10"]
    settings = settings_from_args([a for a in argv if a not in ("--config", "/tmp/options.yaml")])
    assert settings.lora is not None and (settings.lora.max_loras, settings.lora.max_cpu_loras) == (1, 3)
    assert (settings.port, settings.served_model_name, settings.min_step_s) == (8123, "tiny", 0.005)
    assert abs(settings.prefill_s_per_token - 40e-6) < 1e-12
    assert settings.kv_cache is not None
    assert (settings.kv_cache.tokens_per_block, settings.kv_cache.enable_block_reuse) == (16, False)
    assert settings.kv_cache.event_buffer_max_size == 10
