"""``trtfleet engines``: plan, size, hash, render and build TensorRT-LLM engines from a BaseModel.

Subcommands (``-f`` takes a BaseModel YAML file, the whole object, or ``-`` for stdin)::

    trtfleet engines plan -f basemodel.yaml [--workdir DIR]       build plan as JSON on stdout
    trtfleet engines hash -f basemodel.yaml [--short]             engine hash
    trtfleet engines capacity -f basemodel.yaml [--gpu P] [--json]  does it fit? (exit 1 when not)
    trtfleet engines render-repo -f basemodel.yaml --engine-dir DIR --out OUT
    trtfleet engines build --plan plan.json --out URI             run a plan, publish atomically

``plan``, ``hash`` and ``capacity`` follow ``spec.runtime`` as the operator does
(``operator/trtfleet_operator/planning.py``): for ``runtime: pytorch`` there is no engine, so ``plan``
prints the prepare plan (staged under ``--cache-root``) and the LLM-API options as JSON, ``hash`` the
prepare hash, and ``capacity`` the PyTorch backend's memory plan (``max_loras`` / ``max_cpu_loras``).

Exit codes, mapped here and nowhere else: 0 success; 1 the engine does not fit or the build failed
(the reason also goes to the termination log); 2 invalid input (YAML, spec validation, unsupported
combination, unreadable plan), reported one line per problem without a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pydantic
import yaml

from trtfleet.api.basemodel import BaseModel, BaseModelSpec, Runtime, ServingServer
from trtfleet_engines.capacity import CapacityPlan, plan_capacity
from trtfleet_engines.errors import EnginesError, PlanFileError, SpecError
from trtfleet_engines.gpus import GIB, lookup_gpu
from trtfleet_engines.modeldims import load_config_json, resolve_dimensions
from trtfleet_engines.plan import (
    DEFAULT_TRTLLM_DIR,
    DEFAULT_WORKDIR,
    SERVE_ARTIFACT_DIR,
    BuildPlan,
    engine_hash,
    plan_engine_build,
    plan_merged_engine_build,
)
from trtfleet_engines.pytorch.capacity import PytorchCapacityPlan, plan_pytorch_capacity
from trtfleet_engines.pytorch.llmapi import build_llmapi_model_config
from trtfleet_engines.pytorch.options import build_llm_api_options
from trtfleet_engines.pytorch.serving import plan_prepare, prepare_hash

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INVALID = 2
DEFAULT_CACHE_ROOT = "/model-cache"
"""Where the operator mounts the model cache in prepare Jobs and ``trtllm-serve`` pods (``runtime: pytorch``)."""


class InputError(Exception):
    """Bad input to the CLI: each line of ``lines`` is printed as one error."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


def _validation_lines(exc: pydantic.ValidationError, prefix: str) -> list[str]:
    lines = []
    for error in exc.errors(include_url=False):
        loc = ".".join(str(part) for part in error["loc"])
        message = str(error["msg"]).removeprefix("Value error, ")
        lines.append(f"{prefix}: {loc}: {message}" if loc else f"{prefix}: {message}")
    return lines


def load_basemodel(path: str) -> BaseModel:
    """The first BaseModel in a YAML file; raises :class:`InputError` with one line per problem."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
        docs = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except OSError as exc:
        raise InputError([f"{path}: {exc.strerror or exc}"]) from exc
    except yaml.YAMLError as exc:
        raise InputError([f"{path}: not valid YAML: {exc}".replace("\n", " ")]) from exc
    objects = [doc for doc in docs if isinstance(doc, dict) and doc.get("kind") == "BaseModel"]
    if not objects:
        raise InputError([f"{path}: no object with kind: BaseModel in it"])
    try:
        return BaseModel.model_validate(objects[0])
    except pydantic.ValidationError as exc:
        raise InputError(_validation_lines(exc, "<stdin>" if path == "-" else path)) from exc


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


def pytorch_plan_json(spec: BaseModelSpec, cache_root: str) -> dict[str, Any]:
    """What ``engines plan`` prints for ``runtime: pytorch``: the prepare plan and the LLM-API options (and with
    ``serving.server: triton`` the llmapi model's ``model.yaml``)."""
    prepare = plan_prepare(spec, cache_root=cache_root)
    plan: dict[str, Any] = {
        "runtime": Runtime.PYTORCH.value,
        "prepareHash": prepare.content_hash,
        "prepare": asdict(prepare),
        "serveCheckpointDir": prepare.serve_checkpoint_dir,
        "llmApiOptions": build_llm_api_options(spec),
    }
    if spec.serving.server_or_default is ServingServer.TRITON:
        plan["llmapiModelYaml"] = build_llmapi_model_config(spec, checkpoint_dir=prepare.serve_checkpoint_dir)
    return plan


def _cmd_plan(args: argparse.Namespace) -> int:
    spec = load_basemodel(args.file).spec
    if spec.runtime is Runtime.PYTORCH:
        if args.merged_adapter:
            raise InputError(["--merged-adapter plans a merged TensorRT engine; runtime pytorch has no engine "
                              "to merge into (serve the adapter with lora_request, or use runtime tensorrtllm)"])
        _print_json(pytorch_plan_json(spec, args.cache_root))
        return EXIT_OK
    options = {"workdir": args.workdir, "trtllm_dir": args.trtllm_dir, "serve_dir": args.serve_dir}
    if args.merged_adapter:
        plan = plan_merged_engine_build(spec, args.merged_adapter, args.adapter_revision, **options)
    else:
        plan = plan_engine_build(spec, **options)
    sys.stdout.write(plan.to_json())
    return EXIT_OK


def _cmd_hash(args: argparse.Namespace) -> int:
    spec = load_basemodel(args.file).spec
    value = prepare_hash(spec) if spec.runtime is Runtime.PYTORCH else engine_hash(spec)
    print(value[:16] if args.short else value)
    return EXIT_OK


def _cmd_render(args: argparse.Namespace) -> int:
    from trtfleet_engines.triton import render_model_repository

    spec = load_basemodel(args.file).spec
    written = render_model_repository(spec, args.engine_dir, Path(args.out), tokenizer_dir=args.tokenizer_dir,
                                      reference=True if args.reference else None)
    for path in written:
        print(path)
    return EXIT_OK


def _size(value: int) -> str:
    for unit, factor in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= factor:
            return f"{value / factor:8.2f} {unit}"
    return f"{value:8d} B  "


def _count(value: int) -> str:
    return f"{value / 1e9:.2f} B" if value >= 10**9 else f"{value / 1e6:.2f} M"


Row = tuple[str, str, str]


def _head_rows(plan: CapacityPlan | PytorchCapacityPlan, reserve_note: str) -> list[Row]:
    return [
        ("GPU memory", _size(plan.gpu_memory_bytes), ""),
        ("weights per GPU", _size(plan.weights_bytes),
         f"{_count(plan.params)} params" if isinstance(plan, CapacityPlan) else ""),
        ("runtime reserve", _size(plan.runtime_reserve_bytes), reserve_note),
        ("free after both", _size(plan.free_bytes), ""),
        ("KV cache", _size(plan.kv_cache_bytes),
         f"{plan.kv_cache_tokens:,} tokens in {plan.kv_cache_blocks:,} blocks, "
         f"{plan.kv_bytes_per_token:,} bytes per token"),
    ]


def _table(name: str, plan: CapacityPlan | PytorchCapacityPlan, summary: str, rows: list[Row]) -> str:
    lines = [f"BaseModel {name} on {plan.gpu} ({summary}); dimensions from {plan.dimensions_source}"]
    lines += [f"  {label:<17} {value:>14}   {note}".rstrip() for label, value, note in rows]
    lines.append(f"verdict: {plan.verdict}")
    return "\n".join(lines)


def format_capacity(name: str, plan: CapacityPlan, spec_summary: str) -> str:
    """The human-readable capacity table of ``trtfleet engines capacity``."""
    rows = _head_rows(plan, "CUDA/TensorRT workspaces + activations")
    lora = plan.lora
    if lora is None:
        rows.append(("LoRA", "disabled", ""))
    else:
        rows.append(("LoRA page", f"{lora.page_width:,} x {lora.slots_per_page:,}",
                     f"elements x slots; a rank-{lora.max_adapter_rank} adapter takes "
                     f"{lora.max_adapter_pages} page(s), a rank-{lora.optimal_adapter_rank} one "
                     f"{lora.optimal_adapter_pages}"))
        for label, tier in (("LoRA host tier", lora.host), ("LoRA device tier", lora.device)):
            rows.append((label, _size(tier.bytes), f"{tier.pages:,} pages: {tier.max_rank_adapters:,} "
                         f"rank-{lora.max_adapter_rank} or {tier.optimal_rank_adapters:,} "
                         f"rank-{lora.optimal_adapter_rank} adapters"))
    return _table(name, plan, spec_summary, rows)


def format_pytorch_capacity(name: str, plan: PytorchCapacityPlan, spec_summary: str) -> str:
    """The capacity table of a ``runtime: pytorch`` spec: LoRA tiers in adapters (max_loras / max_cpu_loras)."""
    rows = _head_rows(plan, "CUDA workspaces + activations")
    lora = plan.lora
    if lora is None:
        rows.append(("LoRA", "disabled", ""))
    else:
        rows.append(("LoRA page", f"{lora.page_width:,} x {lora.slots_per_page:,}",
                     f"elements x slots; a rank-{lora.max_lora_rank} adapter takes {lora.max_adapter_pages} "
                     f"page(s), {lora.slots_per_module_layer} slot(s) per module-layer, "
                     f"{lora.num_modules} modules"))
        for label, key, tier in (("LoRA host tier", "max_cpu_loras", lora.host),
                                 ("LoRA device tier", "max_loras", lora.device)):
            rows.append((label, _size(tier.bytes), f"{key} {tier.adapters:,}: {tier.pages:,} pages, "
                         f"{tier.max_rank_adapters_fit:,} rank-{lora.max_lora_rank} adapters fit"))
    return _table(name, plan, spec_summary, rows)


def _cmd_capacity(args: argparse.Namespace) -> int:
    basemodel = load_basemodel(args.file)
    spec = basemodel.spec
    gpu = lookup_gpu(args.gpu) if args.gpu else None
    dims = load_config_json(Path(args.config_json)) if args.config_json else resolve_dimensions(spec)
    name = str(basemodel.metadata.get("name", "?"))
    summary = (f"{spec.dtype}, quantization {spec.quantization.mode}, TP {spec.parallelism.tensor} x "
               f"PP {spec.parallelism.pipeline}")
    plan: CapacityPlan | PytorchCapacityPlan
    if spec.runtime is Runtime.PYTORCH:
        plan = plan_pytorch_capacity(spec, gpu, dims)
        text = format_pytorch_capacity(name, plan, f"{summary}, runtime pytorch")
    else:
        plan = plan_capacity(spec, gpu, dims)
        text = format_capacity(name, plan, summary)
    if args.json:
        _print_json(plan.to_json_dict())
    else:
        print(text)
    for problem in plan.problems:
        print(f"error: {problem}", file=sys.stderr)
    return EXIT_OK if plan.verdict == "ok" else EXIT_FAILED


def _load_plan(path: str) -> BuildPlan:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise InputError([f"{path}: {exc.strerror or exc}"]) from exc
    except ValueError as exc:
        raise InputError([f"{path}: not JSON: {exc}"]) from exc
    if not isinstance(data, dict):
        raise InputError([f"{path}: not a trtfleet build plan"])
    return BuildPlan.from_json_dict(data)


def _cmd_build(args: argparse.Namespace) -> int:
    from trtfleet_engines.runner import failure_reason, run_build, write_termination_log

    plan = _load_plan(args.plan)
    try:
        result = run_build(plan, args.out)
    except EnginesError as exc:
        reason = failure_reason(exc, plan)
        print(f"error: {reason}", file=sys.stderr)
        write_termination_log(reason)
        return EXIT_FAILED
    print(f"{result.status}: {result.engine_hash} at {result.destination}")
    return EXIT_OK


def _guarded(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except InputError as exc:
            for line in exc.lines:
                print(f"error: {line}", file=sys.stderr)
            return EXIT_INVALID
        except (SpecError, PlanFileError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_INVALID
        except EnginesError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_FAILED

    return run


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``engines`` subcommands (see the module docstring)."""
    sub = parser.add_subparsers(dest="engines_command", metavar="SUBCOMMAND")

    Command = Callable[[argparse.Namespace], int]

    def add(name: str, help_text: str, command: Command) -> argparse.ArgumentParser:
        child = sub.add_parser(name, help=help_text, description=help_text)
        child.set_defaults(func=_guarded(command))
        return child

    def with_file(child: argparse.ArgumentParser) -> argparse.ArgumentParser:
        child.add_argument("-f", "--file", required=True, help="BaseModel YAML (the whole object), or -")
        return child

    plan = with_file(add("plan", "print the engine build plan as JSON", _cmd_plan))
    plan.add_argument("--workdir", default=DEFAULT_WORKDIR, help="scratch directory of the build")
    plan.add_argument("--trtllm-dir", default=DEFAULT_TRTLLM_DIR, help="TensorRT-LLM sources in the image")
    plan.add_argument("--serve-dir", default=SERVE_ARTIFACT_DIR, help="where serving pods mount the artifact")
    plan.add_argument("--cache-root", default=DEFAULT_CACHE_ROOT,
                      help="runtime pytorch: where the model cache is mounted (the staged checkpoint's root)")
    plan.add_argument("--merged-adapter", metavar="URI", help="plan a merged-adapter engine for this adapter")
    plan.add_argument("--adapter-revision", help="revision of --merged-adapter")

    hash_cmd = with_file(add("hash", "print the engine hash (sha256)", _cmd_hash))
    hash_cmd.add_argument("--short", action="store_true", help="first 16 hex digits only")

    capacity = with_file(add("capacity", "check that the engine fits its GPU (exit 1 if not)", _cmd_capacity))
    capacity.add_argument("--gpu", metavar="PRODUCT", help="plan for this GPU instead of engine.gpu.product")
    capacity.add_argument("--json", action="store_true", help="machine-readable output")
    capacity.add_argument("--config-json", metavar="PATH", help="the checkpoint's config.json (or its dir)")

    render = with_file(add("render-repo", "render the Triton model repository", _cmd_render))
    render.add_argument("--engine-dir", required=True, help="engine directory as the serving pod sees it")
    render.add_argument("--out", required=True, help="directory to write the repository into")
    render.add_argument("--tokenizer-dir", help="tokenizer directory as the serving pod sees it")
    render.add_argument("--reference", action="store_true", help="python backend (CPU reference engine)")

    build = add("build", "run a build plan and publish the engine atomically", _cmd_build)
    build.add_argument("--plan", required=True, help="plan.json from `trtfleet engines plan`")
    build.add_argument("--out", required=True, help="destination: file:///dir, /dir or s3://bucket/prefix")
