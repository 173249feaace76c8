"""Settings of the reference ``pytorch`` mode: trtllm-serve's flags and the LLM-API options file it reads.

The same options YAML trtfleet renders for a real pod (:mod:`trtfleet_engines.pytorch.options`) configures
the reference server through ``--config``; keys that only matter on a GPU (parallelism, CUDA graphs, KV dtype)
are accepted and ignored. Flags given explicitly override the file, as upstream's do. Without a
``lora_config`` block the server ignores ``lora_request`` and answers from the base model, as upstream does.

``scheduler_config.waiting_queue_policy`` (``fcfs`` or ``priority``) orders the waiting queue as upstream's does
(:mod:`trtfleet_engines.reference.waiting_queue`). ``speculative_config`` (NGram) turns on the reference engine's
prompt-lookup speculation (:mod:`trtfleet_engines.reference.speculation`); ``disable_overlap_scheduler`` is
accepted and ignored (the reference engine has no overlap scheduler).

``kv_cache_config`` keys read (``KvCacheConfig`` in ``tensorrt_llm/llmapi/llm_args.py`` @ fcd3f316, same
defaults): ``enable_block_reuse`` (true), ``tokens_per_block`` (32), ``max_tokens`` (the pool's size; upstream
sizes it from GPU memory when unset, the reference engine uses ``max_batch_size x max_seq_len``),
``event_buffer_max_size`` (0: ``POST /kv_cache_events`` answers ``[]``). The ``--kv-*`` flags override them.

Pure apart from :func:`read_options_file`. Errors: :class:`SettingsError` (a file or value that cannot be used).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trtfleet.api.basemodel import LoraModule
from trtfleet_engines.reference.kv_blocks import DEFAULT_TOKENS_PER_BLOCK, KvCacheSettings
from trtfleet_engines.reference.repository import default_model_dir
from trtfleet_engines.reference.speculation import SpeculationSettings, UnsupportedModeError
from trtfleet_engines.reference.waiting_queue import WaitingQueuePolicy

logger = logging.getLogger(__name__)


class SettingsError(Exception):
    """The server cannot start with these settings; the message names the flag or key."""


@dataclass(frozen=True)
class LoraSettings:
    max_lora_rank: int
    max_loras: int
    max_cpu_loras: int
    target_modules: tuple[LoraModule, ...]
    optimal_adapter_size: int = 8
    max_adapter_size: int = 64


@dataclass(frozen=True)
class ServeSettings:
    model_dir: Path
    served_model_name: str
    host: str
    port: int
    max_batch_size: int
    max_num_tokens: int
    max_seq_len: int
    max_queue_size: int
    enable_chunked_prefill: bool
    return_perf_metrics: bool
    lora: LoraSettings | None
    min_step_s: float = 0.0
    prefill_s_per_token: float = 0.0
    kv_cache: KvCacheSettings | None = None
    """None: ``max_batch_size x max_seq_len`` tokens in blocks of 32, reuse on, no events."""
    speculation: SpeculationSettings | None = None
    pcie_bytes_per_s: float = 0.0
    read_bytes_per_s: float = 0.0
    waiting_policy: WaitingQueuePolicy = WaitingQueuePolicy.FCFS
    """``scheduler_config.waiting_queue_policy``: ``priority`` orders the waiting queue by each request's priority."""


DEFAULTS: Mapping[str, Any] = {
    "max_batch_size": 8,
    "max_num_tokens": 2048,
    "max_seq_len": 256,
    "enable_chunked_prefill": False,
    "return_perf_metrics": True,
}
DEFAULT_TARGETS = ("attn_q", "attn_k", "attn_v", "attn_dense", "mlp_h_to_4h", "mlp_4h_to_h", "mlp_gate")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m trtfleet_engines.reference.serve",
        description="trtfleet's CPU reference engine with trtllm-serve's HTTP contract (the pytorch runtime).",
    )
    p.add_argument("model", nargs="?", default=None, help="tiny Llama directory (default: the packaged one)")
    p.add_argument("--host", default="localhost", help="bind address (trtllm-serve's default: localhost)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--config", "--extra_llm_api_options", dest="config", default=None,
                   help="LLM-API options YAML (as trtfleet renders it)")
    p.add_argument("--served_model_name", default=None, help="model name in the API (default: the dir's name)")
    p.add_argument("--max_batch_size", type=int, default=None)
    p.add_argument("--max_num_tokens", type=int, default=None)
    p.add_argument("--max_seq_len", type=int, default=None)
    p.add_argument("--max-queue-size", type=int, default=0, help="waiting requests before 400s (0: no limit)")
    p.add_argument("--max-loras", type=int, default=None, help="lora_config.max_loras (device tier)")
    p.add_argument("--max-cpu-loras", type=int, default=None, help="lora_config.max_cpu_loras (host tier)")
    p.add_argument("--max-lora-rank", type=int, default=None, help="lora_config.max_lora_rank")
    p.add_argument("--min-step-ms", type=float, default=0.0, help="pretend GPU step time (ms)")
    p.add_argument(
        "--prefill-us-per-token",
        type=float,
        default=0.0,
        help="pretend prefill time (us per prompt position computed; reused KV blocks cost nothing)",
    )
    p.add_argument("--pcie-bytes-per-s", type=float, default=0.0,
                   help="pretend host-to-device bandwidth of adapter copies (0: free; an H100: 5e10)")
    p.add_argument("--read-bytes-per-s", type=float, default=0.0,
                   help="pretend volume bandwidth for reading adapter directories (0: as fast as the disk)")
    p.add_argument("--kv-tokens-per-block", type=int, default=None, help="kv_cache_config.tokens_per_block")
    p.add_argument("--kv-max-tokens", type=int, default=None, help="kv_cache_config.max_tokens (pool size)")
    p.add_argument("--kv-block-reuse", choices=("true", "false"), default=None,
                   help="kv_cache_config.enable_block_reuse (default true)")
    p.add_argument("--kv-event-buffer-max-size", type=int, default=None,
                   help="kv_cache_config.event_buffer_max_size (0: no KV events)")
    return p


def read_options_file(path: str | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        loaded = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SettingsError(f"--config {path}: {exc}") from exc
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise SettingsError(f"--config {path}: the root must be a mapping")
    return loaded


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SettingsError(f"{where} must be a positive integer, got {value!r}")
    return value


def _lora(args: argparse.Namespace, options: Mapping[str, Any]) -> LoraSettings | None:
    block = options.get("lora_config")
    flags = (args.max_loras, args.max_cpu_loras, args.max_lora_rank)
    if block is None and all(flag is None for flag in flags):
        return None
    block = dict(block or {})
    if not isinstance(options.get("peft_cache_config", {}), dict):
        raise SettingsError("peft_cache_config must be a mapping")
    peft = dict(options.get("peft_cache_config") or {})
    max_loras = _int(args.max_loras if args.max_loras is not None else block.get("max_loras", 1), "max_loras")
    max_cpu = args.max_cpu_loras if args.max_cpu_loras is not None else block.get("max_cpu_loras", max_loras)
    rank = args.max_lora_rank if args.max_lora_rank is not None else block.get("max_lora_rank", 8)
    names = block.get("lora_target_modules") or list(DEFAULT_TARGETS)
    try:
        targets = tuple(LoraModule(name) for name in names)
    except ValueError as exc:
        raise SettingsError(f"lora_config.lora_target_modules: {exc}") from exc
    return LoraSettings(
        max_lora_rank=_int(rank, "max_lora_rank"), max_loras=max_loras, max_cpu_loras=_int(max_cpu, "max_cpu_loras"),
        target_modules=targets,
        optimal_adapter_size=_int(peft.get("optimal_adapter_size", 8), "peft_cache_config.optimal_adapter_size"),
        max_adapter_size=_int(peft.get("max_adapter_size", 64), "peft_cache_config.max_adapter_size"),
    )


def _kv_cache(args: argparse.Namespace, options: Mapping[str, Any], max_batch_size: int,
              max_seq_len: int) -> KvCacheSettings:
    block = options.get("kv_cache_config") or {}
    if not isinstance(block, dict):
        raise SettingsError("kv_cache_config must be a mapping")

    def pick(flag: Any, key: str, default: Any) -> Any:
        return flag if flag is not None else block.get(key, default)

    tokens_per_block = _int(pick(args.kv_tokens_per_block, "tokens_per_block", DEFAULT_TOKENS_PER_BLOCK),
                            "kv_cache_config.tokens_per_block")
    max_tokens = _int(pick(args.kv_max_tokens, "max_tokens", None) or max_batch_size * max_seq_len,
                      "kv_cache_config.max_tokens")
    reuse_flag = None if args.kv_block_reuse is None else args.kv_block_reuse == "true"
    reuse = pick(reuse_flag, "enable_block_reuse", True)
    if not isinstance(reuse, bool):
        raise SettingsError(f"kv_cache_config.enable_block_reuse must be true or false, got {reuse!r}")
    events = pick(args.kv_event_buffer_max_size, "event_buffer_max_size", 0)
    if isinstance(events, bool) or not isinstance(events, int) or events < 0:
        raise SettingsError(f"kv_cache_config.event_buffer_max_size must be an integer >= 0, got {events!r}")
    return KvCacheSettings(max_blocks=-(-max_tokens // tokens_per_block), tokens_per_block=tokens_per_block,
                           enable_block_reuse=reuse, event_buffer_max_size=events)


def _speculation(options: Mapping[str, Any]) -> SpeculationSettings | None:
    block = options.get("speculative_config")
    if block is None:
        return None
    if not isinstance(block, dict):
        raise SettingsError("speculative_config must be a mapping")
    try:
        return SpeculationSettings.from_config(block)
    except UnsupportedModeError as exc:
        logger.warning("%s: serving without speculation", exc)
        return None
    except ValueError as exc:
        raise SettingsError(str(exc)) from exc


def _waiting_policy(options: Mapping[str, Any]) -> WaitingQueuePolicy:
    block = options.get("scheduler_config") or {}
    if not isinstance(block, dict):
        raise SettingsError("scheduler_config must be a mapping")
    value = block.get("waiting_queue_policy", WaitingQueuePolicy.FCFS.value)
    try:
        return WaitingQueuePolicy(value)
    except ValueError as exc:
        raise SettingsError(f"scheduler_config.waiting_queue_policy must be fcfs or priority, got {value!r}") from exc


def settings_from_args(argv: Sequence[str] | None = None) -> ServeSettings:
    args = parser().parse_args(argv)
    options = read_options_file(args.config)
    model_dir = Path(args.model) if args.model else default_model_dir()

    def pick(name: str) -> Any:
        flag = getattr(args, name, None)
        return flag if flag is not None else options.get(name, DEFAULTS[name])

    max_batch_size = _int(pick("max_batch_size"), "max_batch_size")
    max_seq_len = _int(pick("max_seq_len"), "max_seq_len")
    return ServeSettings(
        model_dir=model_dir,
        served_model_name=args.served_model_name or model_dir.name,
        host=args.host,
        port=args.port,
        max_batch_size=max_batch_size,
        max_num_tokens=_int(pick("max_num_tokens"), "max_num_tokens"),
        max_seq_len=max_seq_len,
        max_queue_size=max(args.max_queue_size, 0),
        enable_chunked_prefill=bool(pick("enable_chunked_prefill")),
        return_perf_metrics=bool(pick("return_perf_metrics")),
        lora=_lora(args, options),
        min_step_s=max(args.min_step_ms, 0.0) / 1000.0,
        prefill_s_per_token=max(args.prefill_us_per_token, 0.0) / 1e6,
        kv_cache=_kv_cache(args, options, max_batch_size, max_seq_len),
        speculation=_speculation(options),
        pcie_bytes_per_s=max(args.pcie_bytes_per_s, 0.0),
        read_bytes_per_s=max(args.read_bytes_per_s, 0.0),
        waiting_policy=_waiting_policy(options),
    )
