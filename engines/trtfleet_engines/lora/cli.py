"""``trtfleet lora``: convert, inspect and verify LoRA adapters.

    trtfleet lora convert SRC_DIR OUT_DIR [--dtype float16|bfloat16] [--engine-dtype D]
                          [--target-modules attn_q ...] [--max-rank N] [--force]
                          [--base-config config.json | --hidden-size H --intermediate-size I --num-layers L
                           --num-heads N --num-kv-heads K [--head-dim D]]
    trtfleet lora inspect DIR [--json] [--base-config ...] [--target-modules ...]
                          [--optimal-adapter-size 8] [--max-adapter-size 64] [--max-lora-rank 64]
    trtfleet lora verify OUT_DIR [--source SRC_DIR]
    trtfleet lora base-variant --base DIR --quantization nf4:64:double:bfloat16 --out DIR

Exit codes: 0 success, 1 a ``LoraConversionError`` (message on stderr), 2 bad arguments (argparse).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trtfleet.api.basemodel import DEFAULT_TARGET_MODULES, Architecture, Dtype, ModelDimensions
from trtfleet_engines.errors import DimensionsUnknownError
from trtfleet_engines.lora.convert import (
    DEFAULT_MAX_RANK,
    ConversionOptions,
    convert_dir,
    parse_target_modules,
)
from trtfleet_engines.lora.errors import AdapterFormatError, LoraConversionError
from trtfleet_engines.lora.inspect import CacheSettings, format_report, inspect_dir
from trtfleet_engines.lora.manifest import verify_dir
from trtfleet_engines.lora.merge import KEEP_BASE_DTYPE, merge_dir
from trtfleet_engines.modeldims import load_config_json

EXIT_OK = 0
EXIT_FAILED = 1
_DIM_FLAGS = ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads")


def _add_dims_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("base model dimensions (to check shapes and plan cache pages)")
    group.add_argument("--base-config", type=Path, help="the base model's HF config.json (or its directory)")
    for flag in _DIM_FLAGS:
        group.add_argument(f"--{flag.replace('_', '-')}", type=int, dest=flag)
    group.add_argument("--head-dim", type=int, dest="head_dim")


def _add_target_modules(parser: argparse.ArgumentParser, default_help: str) -> None:
    parser.add_argument(
        "--target-modules",
        nargs="+",
        metavar="MODULE",
        help=f"the engine's --lora_target_modules (TRT-LLM names); default: {default_help}",
    )


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="lora_command", metavar="COMMAND")

    convert = sub.add_parser("convert", help="convert a PEFT adapter to TRT-LLM lora_weights/lora_config .npy")
    convert.add_argument("src_dir", type=Path, help="PEFT adapter directory")
    convert.add_argument("out_dir", type=Path, help="output directory (created atomically)")
    convert.add_argument(
        "--dtype",
        choices=[d.value for d in Dtype],
        default=Dtype.FLOAT16.value,
        help="storage dtype; must equal the engine dtype (default float16)",
    )
    convert.add_argument(
        "--engine-dtype",
        choices=[d.value for d in Dtype],
        help="the engine's dtype; conversion fails when --dtype differs",
    )
    convert.add_argument(
        "--architecture",
        choices=[a.value for a in Architecture],
        help="the base model's architecture (phi3 maps a fused gate_up_proj to mlp_h_to_4h; default: the Llama "
        "family's mapping, gate_up_proj -> mlp_gate_up)",
    )
    _add_target_modules(convert, " ".join(m.value for m in DEFAULT_TARGET_MODULES))
    convert.add_argument("--max-rank", type=int, default=DEFAULT_MAX_RANK, help="the engine's max_lora_rank")
    convert.add_argument("--force", action="store_true", help="replace OUT_DIR if it exists")
    _add_dims_arguments(convert)
    convert.set_defaults(func=run_convert)

    inspect = sub.add_parser("inspect", help="rank, modules, layers, bytes and LoRA cache pages of an adapter")
    inspect.add_argument("dir", type=Path, help="a PEFT adapter directory or a converted one")
    inspect.add_argument("--json", action="store_true", help="print JSON")
    _add_target_modules(inspect, "the adapter's own modules")
    inspect.add_argument("--optimal-adapter-size", type=int, default=CacheSettings.optimal_adapter_size)
    inspect.add_argument("--max-adapter-size", type=int, default=CacheSettings.max_adapter_size)
    inspect.add_argument("--max-lora-rank", type=int, default=CacheSettings.max_lora_rank)
    _add_dims_arguments(inspect)
    inspect.set_defaults(func=run_inspect)

    merge = sub.add_parser("merge", help="fold a PEFT adapter into its base model's safetensors (Adapter mode: merged)")
    merge.add_argument("--base", type=Path, required=True, help="the base model directory (HF safetensors)")
    merge.add_argument("--adapter", type=Path, required=True, help="the PEFT adapter directory")
    merge.add_argument("--out", type=Path, required=True, help="output directory (created atomically)")
    merge.add_argument(
        "--dtype",
        choices=[*(d.value for d in Dtype), KEEP_BASE_DTYPE],
        default=Dtype.FLOAT16.value,
        help="dtype of the merged weights: the engine's (default float16), or 'base' to keep each weight's own "
        "(summed in float64; the CPU reference engine's float32); other tensors are copied as they are",
    )
    merge.add_argument("--force", action="store_true", help="replace OUT if it exists")
    merge.set_defaults(func=run_merge)

    variant = sub.add_parser("base-variant", help="write the base a QLoRA adapter was trained on: every decoder "
                             "linear weight quantized and dequantized as bitsandbytes does")
    variant.add_argument("--base", type=Path, required=True, help="the base model (HF safetensors, sharded or not)")
    variant.add_argument("--quantization", required=True, metavar="SPEC",
                         help="TYPE[:BLOCK][:double][:DTYPE], e.g. nf4:64:double:bfloat16")
    variant.add_argument("--out", type=Path, required=True, help="output directory (must not exist)")
    variant.set_defaults(func=run_base_variant)

    verify = sub.add_parser("verify", help="check a converted directory against its manifest.json sha256s")
    verify.add_argument("out_dir", type=Path)
    verify.add_argument("--source", type=Path, help="also check the PEFT source files")
    verify.set_defaults(func=run_verify)


def dims_from_args(args: argparse.Namespace) -> ModelDimensions | None:
    given = {flag: getattr(args, flag) for flag in _DIM_FLAGS if getattr(args, flag) is not None}
    if args.base_config is not None:
        if given:
            raise AdapterFormatError("give either --base-config or the dimension flags, not both")
        try:
            return load_config_json(args.base_config).dims
        except DimensionsUnknownError as exc:
            raise AdapterFormatError(str(exc)) from exc
    if not given:
        return None
    missing = [f"--{f.replace('_', '-')}" for f in _DIM_FLAGS if f not in given]
    if missing:
        raise AdapterFormatError(f"dimension flags need all of them; missing {' '.join(missing)}")
    return ModelDimensions(
        hidden_size=given["hidden_size"],
        intermediate_size=given["intermediate_size"],
        num_layers=given["num_layers"],
        num_attention_heads=given["num_heads"],
        num_kv_heads=given["num_kv_heads"],
        head_dim=args.head_dim,
        vocab_size=1,
    )


def _base_config_file(args: argparse.Namespace) -> Path | None:
    path: Path | None = args.base_config
    if path is not None and path.is_dir():
        path = path / "config.json"
    return path


def _fail(exc: LoraConversionError) -> int:
    print(f"trtfleet lora: {exc}", file=sys.stderr)
    return EXIT_FAILED


def run_convert(args: argparse.Namespace) -> int:
    try:
        options = ConversionOptions(
            dtype=Dtype(args.dtype),
            target_modules=parse_target_modules(args.target_modules) if args.target_modules else DEFAULT_TARGET_MODULES,
            max_rank=args.max_rank,
            dims=dims_from_args(args),
            engine_dtype=Dtype(args.engine_dtype) if args.engine_dtype else None,
            architecture=Architecture(args.architecture) if args.architecture else None,
        )
        converted = convert_dir(
            args.src_dir, args.out_dir, options, base_config=_base_config_file(args), replace=args.force
        )
    except LoraConversionError as exc:
        return _fail(exc)
    rank = max(row.rank for row in converted.rows)
    print(
        f"{args.out_dir}: {len(converted.rows)} rows, rank {rank}, {converted.dtype.value}, "
        f"{converted.weights.nbytes} bytes"
    )
    return EXIT_OK


def run_inspect(args: argparse.Namespace) -> int:
    try:
        result = inspect_dir(
            args.dir,
            settings=CacheSettings(args.optimal_adapter_size, args.max_adapter_size, args.max_lora_rank),
            dims=dims_from_args(args),
            target_modules=parse_target_modules(args.target_modules) if args.target_modules else None,
        )
    except LoraConversionError as exc:
        return _fail(exc)
    print(json.dumps(result.to_dict(), indent=2) if args.json else format_report(result))
    return EXIT_OK


def run_merge(args: argparse.Namespace) -> int:
    try:
        dtype = None if args.dtype == KEEP_BASE_DTYPE else Dtype(args.dtype)
        result = merge_dir(args.base, args.adapter, args.out, dtype, replace=args.force)
    except LoraConversionError as exc:
        return _fail(exc)
    print(
        f"{args.out}: {result.modules} adapter modules merged into {len(result.changed)} weights "
        f"({result.dtype.value if result.dtype else 'base dtype'}), {len(result.shards)} shard(s)"
    )
    return EXIT_OK


def run_base_variant(args: argparse.Namespace) -> int:
    from trtfleet_engines.lora.qlora_base import BaseQuantization, write_base_variant

    try:
        spec = BaseQuantization.parse(args.quantization)
        replaced = write_base_variant(args.base, spec, args.out)
    except LoraConversionError as exc:
        return _fail(exc)
    except (ValueError, OSError) as exc:
        print(f"trtfleet lora: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(f"{args.out}: {len(replaced)} linear weights quantized and dequantized as {args.quantization}")
    return EXIT_OK


def run_verify(args: argparse.Namespace) -> int:
    try:
        manifest = verify_dir(args.out_dir, source_dir=args.source)
    except LoraConversionError as exc:
        return _fail(exc)
    print(f"{args.out_dir}: ok ({manifest.num_rows} rows, rank {manifest.rank}, {manifest.dtype})")
    return EXIT_OK
