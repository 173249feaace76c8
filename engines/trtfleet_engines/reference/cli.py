"""``trtfleet worker``: serve the CPU reference engine with a real tritonserver, in the foreground.

It builds the model repository in a temporary directory, runs tritonserver (its log on this process's
stdout/stderr), forwards SIGTERM / SIGINT to it as SIGTERM, and removes every file it made on exit.
Exit code: tritonserver's, or 0 when it stopped because we were asked to stop; 1 when it could not start.

    trtfleet worker --http-port 8000 --grpc-port 8001 --metrics-port 8002 --lora-host-bytes 138240

``--runtime pytorch`` serves the same engine with trtllm-serve's HTTP contract instead
(``python -m trtfleet_engines.reference.serve``, in this process): OpenAI API on ``--http-port``, the
LLM-API options rendered from ``--spec`` (or the reference one), adapters by ``lora_request`` path:

    trtfleet worker --runtime pytorch --http-port 8000 --served-model-name tiny --max-loras 1 --max-cpu-loras 2

``--merged-adapter DIR`` serves one PEFT adapter merged into the model (Adapter ``mode: merged``,
:mod:`trtfleet_engines.reference.merged`): no LoRA inputs, the adapter's name (``--merged-adapter-name``,
default the directory's name) as the served model name of ``--runtime pytorch``. ``--base-quantization SPEC``
serves (and merges into) the base a QLoRA adapter was trained on (:mod:`trtfleet_engines.lora.qlora_base`).

``--runtime pytorch --server triton`` serves it as Triton with TRT-LLM's ``llmapi`` model (``tensorrt_llm``,
:mod:`trtfleet_engines.reference.llmapi`): tritonserver on the three ports, ``model.yaml`` rendered from
``--spec``, adapters by the ``lora_path`` input, the same tiers (``--max-loras``, ``--max-cpu-loras``).
"""

from __future__ import annotations

import argparse
import logging
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

import yaml
from pydantic import ValidationError

from trtfleet.api.basemodel import BaseModel, BaseModelSpec
from trtfleet_engines.errors import EnginesError
from trtfleet_engines.reference.errors import ReferenceEngineError, RepositoryError, WorkerError
from trtfleet_engines.reference.server import READY_TIMEOUT_S, start_worker

logger = logging.getLogger(__name__)

EXIT_FAILED = 1


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--http-port", type=int, default=8000, help="Triton HTTP port (default 8000)")
    parser.add_argument("--grpc-port", type=int, default=8001, help="Triton gRPC port (default 8001)")
    parser.add_argument("--metrics-port", type=int, default=8002, help="Triton metrics port (default 8002)")
    parser.add_argument("--host", default="0.0.0.0", help="address to bind, as tritonserver does (default 0.0.0.0)")
    parser.add_argument(
        "--model",
        "--model-dir",
        dest="model",
        type=Path,
        default=None,
        help="tiny Llama directory: config.json + model.safetensors (default: the packaged model)",
    )
    parser.add_argument(
        "--spec",
        type=Path,
        default=None,
        help="BaseModel spec, YAML or JSON: the whole object or its spec (default: the reference tiny model)",
    )
    parser.add_argument("--lora-host-bytes", type=int, default=None, help="lora_cache_host_memory_bytes override")
    parser.add_argument("--lora-device-bytes", type=int, default=None, help="device (GPU) LoRA tier bytes override")
    parser.add_argument("--gpu-memory-bytes", type=int, default=None, help="pretend free GPU memory")
    parser.add_argument("--max-batch-size", type=int, default=None, help="in-flight batch size override")
    parser.add_argument("--max-num-tokens", type=int, default=None, help="tokens per step override")
    parser.add_argument("--max-queue-size", type=int, default=None, help="waiting requests before back-pressure")
    parser.add_argument("--min-step-ms", type=float, default=None, help="pretend GPU step time (ms per step)")
    parser.add_argument(
        "--prefill-us-per-token",
        type=float,
        default=None,
        help="pretend prefill time (us per prompt position computed; reused KV blocks cost nothing)",
    )
    parser.add_argument("--pcie-bytes-per-s", type=float, default=None,
                        help="pretend host-to-device bandwidth of adapter copies (an H100's PCIe Gen5 x16: 5e10)")
    parser.add_argument("--network-bytes-per-s", type=float, default=None,
                        help="triton: pretend pod network for LoRA weights sent with requests (10 GbE: 1.25e9)")
    parser.add_argument("--read-bytes-per-s", type=float, default=None,
                        help="pytorch: pretend volume bandwidth for reading adapter directories (5e8)")
    parser.add_argument("--ready-timeout", type=float, default=READY_TIMEOUT_S, help="seconds to wait for ready")
    parser.add_argument("--log-verbose", type=int, default=0, help="tritonserver --log-verbose level")
    parser.add_argument("--runtime", choices=("triton", "pytorch"), default="triton",
                        help="triton: tritonserver (default); pytorch: trtllm-serve's OpenAI API on --http-port")
    parser.add_argument("--server", choices=("trtllm-serve", "triton"), default="trtllm-serve",
                        help="pytorch: trtllm-serve's OpenAI API (default) or Triton with the llmapi model")
    parser.add_argument("--served-model-name", default=None, help="pytorch: the model's name in the API")
    parser.add_argument("--max-loras", type=int, default=None, help="pytorch: lora_config.max_loras override")
    parser.add_argument("--max-cpu-loras", type=int, default=None, help="pytorch: lora_config.max_cpu_loras override")
    parser.add_argument("--kv-tokens-per-block", type=int, default=None, help="KV-cache block size (default 32)")
    parser.add_argument("--kv-max-tokens", type=int, default=None,
                        help="KV-cache size in tokens (default max_batch_size x max_seq_len)")
    parser.add_argument("--kv-block-reuse", choices=("true", "false"), default=None,
                        help="KV-cache block reuse (default: the spec's serving.enableKvCacheReuse, else on)")
    parser.add_argument("--kv-event-buffer-max-size", type=int, default=None,
                        help="pytorch: kv_cache_config.event_buffer_max_size (POST /kv_cache_events; 0: none)")
    parser.add_argument("--merged-adapter", type=Path, default=None, metavar="DIR",
                        help="serve this PEFT adapter merged into the model (Adapter mode: merged), LoRA off")
    parser.add_argument("--merged-adapter-name", default=None,
                        help="the merged adapter's served name (default: the --merged-adapter directory's name)")
    parser.add_argument("--base-quantization", default=None, metavar="SPEC",
                        help="serve the base a QLoRA adapter was trained on: TYPE[:BLOCK][:double][:DTYPE], e.g. "
                        "nf4:64:double:bfloat16 (bitsandbytes' quantize/dequantize of every linear weight)")
    parser.set_defaults(func=run)


def _load_spec(path: Path | None) -> BaseModelSpec | None:
    """A BaseModel manifest or a bare spec (the operator mounts ``spec.model_dump_json()``)."""
    if path is None:
        return None
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if isinstance(data, dict) and data.get("kind") == "BaseModel":
        return BaseModel.model_validate(data).spec
    return BaseModelSpec.model_validate(data)


def prepare_model(args: argparse.Namespace, work_dir: Path) -> BaseModelSpec | None:
    """With ``--base-quantization``: write QLoRA's base variant under ``work_dir`` and serve it. With
    ``--merged-adapter``: merge it into the model (or that variant) under ``work_dir``, point ``args.model`` at
    the result, name it, and return the spec with LoRA off; else the ``--spec`` as given (None: the default)."""
    spec = _load_spec(args.spec)
    if args.merged_adapter is None and args.base_quantization is None:
        return spec
    from trtfleet_engines.plan import merged_spec
    from trtfleet_engines.reference.merged import MergedAdapter, base_variant_dir, merged_model_dir
    from trtfleet_engines.reference.repository import default_model_dir, default_reference_spec

    if args.base_quantization is not None:
        args.model = base_variant_dir(args.model or default_model_dir(), args.base_quantization, work_dir)
        logger.info("serving the %s base (QLoRA's) of the model", args.base_quantization)
    if args.merged_adapter is None:
        return spec
    adapter = MergedAdapter.from_flags(args.merged_adapter, args.merged_adapter_name)
    if args.served_model_name not in (None, adapter.served_name):
        raise RepositoryError(f"--served-model-name {args.served_model_name} differs from the merged adapter's "
                              f"name {adapter.served_name}")
    args.model = merged_model_dir(args.model or default_model_dir(), adapter, work_dir)
    args.served_model_name = adapter.served_name
    logger.info("serving adapter %s merged into %s", adapter.served_name, args.model)
    return merged_spec(spec or default_reference_spec())


def serve_argv(args: argparse.Namespace, options_file: Path | None) -> list[str]:
    """The reference trtllm-serve's command line for the worker's flags (pure)."""
    argv = [str(args.model)] if args.model is not None else []
    argv += ["--host", args.host, "--port", str(args.http_port)]
    named = {"--config": options_file, "--served_model_name": args.served_model_name}
    for flag, value in named.items():
        if value is not None:
            argv += [flag, str(value)]
    return argv + engine_flags(args)


def engine_flags(args: argparse.Namespace) -> list[str]:
    """The ``pytorch`` mode's engine flags of the worker's options (pure; also the llmapi model's)."""
    argv: list[str] = []
    flags = {
        "--max_batch_size": args.max_batch_size,
        "--max_num_tokens": args.max_num_tokens,
        "--max-queue-size": args.max_queue_size,
        "--min-step-ms": args.min_step_ms,
        "--prefill-us-per-token": args.prefill_us_per_token,
        "--pcie-bytes-per-s": args.pcie_bytes_per_s,
        "--read-bytes-per-s": args.read_bytes_per_s,
        "--max-loras": args.max_loras,
        "--max-cpu-loras": args.max_cpu_loras,
        "--kv-tokens-per-block": args.kv_tokens_per_block,
        "--kv-max-tokens": args.kv_max_tokens,
        "--kv-block-reuse": args.kv_block_reuse,
        "--kv-event-buffer-max-size": args.kv_event_buffer_max_size,
    }
    for flag, value in flags.items():
        if value is not None:
            argv += [flag, str(value)]
    return argv


def run_serve(args: argparse.Namespace) -> int:
    """``--runtime pytorch``: the reference trtllm-serve in this process, its options from ``--spec``."""
    from trtfleet_engines.pytorch.options import render_llm_api_options
    from trtfleet_engines.reference.repository import default_reference_spec
    from trtfleet_engines.reference.serve.__main__ import main as serve_main

    root = Path(tempfile.mkdtemp(prefix="trtfleet-worker-serve-"))
    try:
        spec = prepare_model(args, root) or default_reference_spec()
        options = root / "llm-api-options.yaml"
        options.write_text(render_llm_api_options(spec), encoding="utf-8")
        return serve_main(serve_argv(args, options))
    except (EnginesError, ReferenceEngineError, ValidationError, OSError, yaml.YAMLError, ValueError) as exc:
        print(f"trtfleet worker: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        shutil.rmtree(root, ignore_errors=True)


def build_repository(args: argparse.Namespace, out_dir: Path) -> Path:
    """The worker's model repository: the reference Triton models, or with ``--runtime pytorch --server
    triton`` the llmapi ``tensorrt_llm`` model."""
    from trtfleet_engines.reference.repository import build_reference_repository, default_reference_spec

    spec = prepare_model(args, out_dir.parent)
    if args.runtime == "pytorch":
        from trtfleet_engines.reference.llmapi.repository import build_llmapi_repository

        spec = spec or default_reference_spec()
        return build_llmapi_repository(out_dir, spec, model_dir=args.model, serve_args=engine_flags(args))
    return build_reference_repository(
        out_dir,
        spec,
        model_dir=args.model,
        lora_cache_host_bytes=args.lora_host_bytes,
        lora_cache_device_bytes=args.lora_device_bytes,
        gpu_memory_bytes=args.gpu_memory_bytes,
        max_batch_size=args.max_batch_size,
        max_num_tokens=args.max_num_tokens,
        max_queue_size=args.max_queue_size,
        min_step_ms=args.min_step_ms,
        prefill_us_per_token=args.prefill_us_per_token,
        pcie_bytes_per_s=args.pcie_bytes_per_s,
        network_bytes_per_s=args.network_bytes_per_s,
        kv_tokens_per_block=args.kv_tokens_per_block,
        kv_max_tokens=args.kv_max_tokens,
        enable_kv_cache_reuse=None if args.kv_block_reuse is None else args.kv_block_reuse == "true",
    )


def run(args: argparse.Namespace) -> int:
    if args.runtime == "pytorch" and args.server != "triton":
        return run_serve(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    root = Path(tempfile.mkdtemp(prefix="trtfleet-worker-repo-"))
    stopping = False

    def forward(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        logger.info("signal %s: stopping tritonserver", signal.Signals(signum).name)
        if worker is not None and worker.running():
            worker.process.send_signal(signal.SIGTERM)

    worker = None
    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        repo = build_repository(args, root / "models")
        worker = start_worker(
            repo,
            http_port=args.http_port,
            grpc_port=args.grpc_port,
            metrics_port=args.metrics_port,
            host=args.host,
            wait=False,
            log_to_console=True,
            log_verbose=args.log_verbose,
            on_stub_death="exit",  # a dead stub stops the worker: the container restarts, readiness fails
        )
        started = time.monotonic()
        if not stopping:
            try:
                worker.wait_ready(args.ready_timeout)
            except WorkerError:
                if stopping:  # a signal arrived while it was starting
                    return 0
                raise
            logger.info(
                "worker ready in %.2f s: http=%s grpc=%s metrics=%s",
                time.monotonic() - started,
                worker.http_port,
                worker.grpc_port,
                worker.metrics_port,
            )
        code = worker.process.wait()
        if worker.watchdog is not None and worker.watchdog.deaths:
            worker.stop()  # its clean-up (stubs tritonserver left behind) logs first: the death is the last line
            print(f"trtfleet worker: {worker.watchdog.deaths[0].describe()}", file=sys.stderr)
            return EXIT_FAILED
        return 0 if stopping else code
    except (EnginesError, ReferenceEngineError, ValidationError, OSError, yaml.YAMLError) as exc:
        print(f"trtfleet worker: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        if worker is not None:
            worker.stop()
        shutil.rmtree(root, ignore_errors=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
