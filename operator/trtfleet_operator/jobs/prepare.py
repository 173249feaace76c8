"""Entrypoint of the ``runtime: pytorch`` prepare Job: ``python3 -m trtfleet_operator.jobs.prepare --plan F``.

``F`` is the prepare plan (:class:`trtfleet_engines.pytorch.serving.PreparePlan` as JSON, from the plan
ConfigMap). Steps, each skipped when its marker file says it is done (the plan is content-addressed, so a
finished directory never needs redoing):

1. **Stage**: make the HF checkpoint readable (``file://`` and ``pvc://`` in place, ``hf://`` and ``s3://``
   downloaded; :func:`trtfleet_operator.jobs.convert.local_source`), copy it into a staging directory
   beside ``stage.destination_dir`` and rename it into place, so a crash never leaves a half checkpoint
   where ``trtllm-serve`` looks. A directory source without ``config.json`` is refused (exit 2).
2. **Merge** (a merged Adapter's plan): fetch the PEFT adapter like the checkpoint and fold it into the staged
   weights at the plan's dtype (``trtfleet lora merge``, :func:`trtfleet_engines.lora.merge.merge_dir`) into
   ``merge.output_dir``; an adapter that does not fit the model is refused (exit 2).
3. **Base variant** (a QLoRA base variant's plan): the staged checkpoint with every decoder linear weight
   quantized and dequantized as bitsandbytes does (:func:`trtfleet_engines.lora.qlora_base.write_base_variant`),
   written beside ``variant.output_dir`` and renamed into place; a model it cannot take is refused (exit 2).
4. **Quantize** (when the plan has it): run its argv (ModelOpt's ``hf_ptq.py``), which exports the
   quantized HF checkpoint to ``quantize.output_dir``.
5. **Draft** (a plan with ``speculative.draft``): stage the draft checkpoint like the model into
   ``draft.destination_dir`` and check that it fits the staged model
   (:func:`trtfleet_engines.speculation.draft_problems`: the same vocabulary and tokenizer for DraftTarget and
   PARD, an EAGLE-3 head of the model's hidden size); a draft that does not fit is removed again and refused
   (exit 2), so nothing serves it.
6. Write a one-line JSON report (what was staged, where trtllm-serve loads from) to the termination log.

Any failure writes one line saying what failed to the termination log: exit 2 for a plan or source that
can never work (the Job fails at once, see ``podFailurePolicy``), exit 1 otherwise (retried).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trtfleet_operator.jobs.convert import FetchError, local_source

DONE_MARKER = ".trtfleet-prepared"
SPEC_ERROR_EXIT_CODE = 2
TERMINATION_LOG_MAX_BYTES = 4096
STDERR_TAIL_BYTES = 3000


class PrepareError(Exception):
    """One step failed; ``exit_code`` 2 when retrying cannot help."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _report(path: Path, text: str) -> None:
    try:
        path.write_bytes(text.encode()[:TERMINATION_LOG_MAX_BYTES])
    except OSError as exc:
        print(f"cannot write {path}: {exc}", file=sys.stderr)


def _done(directory: Path) -> bool:
    return (directory / DONE_MARKER).is_file()


def stage(stage_plan: dict[str, Any]) -> bool:
    """Put the checkpoint into ``destination_dir`` once; True when it did, False when it was there.

    Downloads land beside the destination (same volume: a rename publishes them); local sources are copied.
    """
    destination = Path(stage_plan["destination_dir"])
    if _done(destination):
        return False
    download = destination.with_name(f".{destination.name}.download")
    staging = destination.with_name(f".{destination.name}.staging")
    for leftover in (download, staging):
        shutil.rmtree(leftover, ignore_errors=True)
    destination.parent.mkdir(parents=True, exist_ok=True)
    try:
        source = local_source(stage_plan["source_uri"], stage_plan.get("revision"), download)
    except FetchError as exc:
        raise PrepareError(f"fetching {stage_plan['source_uri']} failed: {exc}") from exc
    if not (source / "config.json").is_file():
        raise PrepareError(
            f"{stage_plan['source_uri']} is not a HuggingFace checkpoint directory (no config.json in {source})",
            SPEC_ERROR_EXIT_CODE,
        )
    if source.is_relative_to(download):
        source.rename(staging)
        shutil.rmtree(download, ignore_errors=True)
    else:
        shutil.copytree(source, staging, ignore=shutil.ignore_patterns(".git", ".cache", DONE_MARKER))
    (staging / DONE_MARKER).write_text(json.dumps({"source": stage_plan["source_uri"]}) + "\n")
    shutil.rmtree(destination, ignore_errors=True)
    staging.rename(destination)
    return True


def merge(merge_plan: dict[str, Any], staged_dir: Path) -> bool:
    """Fold the plan's adapter into ``staged_dir`` once, into ``output_dir``; True when it did."""
    from trtfleet_engines.lora.errors import LoraConversionError
    from trtfleet_engines.lora.merge import merge_dir

    from trtfleet.api.basemodel import Dtype

    output = Path(merge_plan["output_dir"])
    if _done(output):
        return False
    adapter_dir = Path(merge_plan["adapter_dir"])
    download = adapter_dir.with_name(f".{adapter_dir.name}.download")
    shutil.rmtree(download, ignore_errors=True)
    try:
        adapter = local_source(merge_plan["adapter_uri"], merge_plan.get("revision"), download)
    except FetchError as exc:
        raise PrepareError(f"fetching adapter {merge_plan['adapter_uri']} failed: {exc}") from exc
    try:
        merge_dir(staged_dir, adapter, output, Dtype(merge_plan["dtype"]), replace=True)
    except (LoraConversionError, ValueError) as exc:
        raise PrepareError(f"merging {merge_plan['adapter_uri']} failed: {exc}", SPEC_ERROR_EXIT_CODE) from exc
    finally:
        shutil.rmtree(download, ignore_errors=True)
    (output / DONE_MARKER).write_text(json.dumps({"adapter": merge_plan["adapter_uri"]}) + "\n")
    return True


def base_variant(variant_plan: dict[str, Any], staged_dir: Path) -> bool:
    """Write QLoRA's base variant of ``staged_dir`` once, into ``output_dir``; True when it did."""
    from trtfleet_engines.lora.errors import LoraConversionError
    from trtfleet_engines.lora.qlora_base import BaseQuantization, write_base_variant

    output = Path(variant_plan["output_dir"])
    if _done(output):
        return False
    partial = output.with_name(f".{output.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        write_base_variant(staged_dir, BaseQuantization.parse(str(variant_plan["quantization"])), partial)
    except (LoraConversionError, ValueError) as exc:
        shutil.rmtree(partial, ignore_errors=True)
        message = f"the {variant_plan['quantization']} base variant failed: {exc}"
        raise PrepareError(message, SPEC_ERROR_EXIT_CODE) from exc
    (partial / DONE_MARKER).write_text(json.dumps({"baseQuantization": variant_plan["quantization"]}) + "\n")
    shutil.rmtree(output, ignore_errors=True)
    partial.rename(output)
    return True


def _json_file(path: Path) -> dict[str, Any] | None:
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None


def draft(draft_plan: dict[str, Any], model_dir: Path) -> bool:
    """Stage the speculative draft once and check it fits ``model_dir``; True when it staged it now."""
    from trtfleet_engines.speculation import draft_problems

    from trtfleet.api.basemodel import SpeculativeMode

    destination = Path(draft_plan["destination_dir"])
    staged = stage({"source_uri": draft_plan["source_uri"], "revision": draft_plan.get("revision"),
                    "destination_dir": str(destination)})
    base_config, draft_config = _json_file(model_dir / "config.json"), _json_file(destination / "config.json")
    if base_config is None or draft_config is None:
        raise PrepareError(f"cannot read config.json of the model ({model_dir}) or of the draft ({destination})",
                           SPEC_ERROR_EXIT_CODE)
    problems = draft_problems(
        SpeculativeMode(draft_plan["mode"]), base_config, draft_config,
        base_tokenizer=_json_file(model_dir / "tokenizer.json"),
        draft_tokenizer=_json_file(destination / "tokenizer.json"),
    )
    if problems:
        shutil.rmtree(destination, ignore_errors=True)
        raise PrepareError(f"speculative.draft {draft_plan['source_uri']} does not fit the model: "
                           + "; ".join(problems), SPEC_ERROR_EXIT_CODE)
    return staged


def quantize(quantize_plan: dict[str, Any]) -> bool:
    """Run the quantization argv once; True when it ran."""
    output = Path(quantize_plan["output_dir"])
    if _done(output):
        return False
    argv = [str(arg) for arg in quantize_plan["argv"]]
    try:
        done = subprocess.run(argv, stderr=subprocess.PIPE, text=True, check=False)
    except OSError as exc:
        raise PrepareError(f"cannot run {argv[0]}: {exc}") from exc
    if done.returncode != 0:
        tail = done.stderr.strip()[-STDERR_TAIL_BYTES:] or f"exit code {done.returncode}"
        sys.stderr.write(done.stderr)
        raise PrepareError(f"quantization ({' '.join(argv[:2])}) failed: {tail}")
    if not (output / "config.json").is_file():
        raise PrepareError(f"quantization exited 0 but wrote no checkpoint to {output} (no config.json)")
    (output / DONE_MARKER).write_text("{}\n")
    return True


def run(args: argparse.Namespace) -> int:
    log = Path(args.termination_log)
    try:
        plan = json.loads(Path(args.plan).read_text())
        stage_plan, quantize_plan, merge_plan = plan["stage"], plan.get("quantize"), plan.get("merge")
        variant_plan, draft_plan = plan.get("variant"), plan.get("draft")
        weights_dir = merge_plan["output_dir"] if merge_plan else stage_plan["destination_dir"]
        weights_dir = variant_plan["output_dir"] if variant_plan else weights_dir
        serve_dir = quantize_plan["output_dir"] if quantize_plan else weights_dir
    except (OSError, ValueError, KeyError, TypeError) as exc:
        _report(log, f"the prepare plan {args.plan} is unreadable: {exc}")
        return SPEC_ERROR_EXIT_CODE
    try:
        staged = stage(stage_plan)
        merged = merge(merge_plan, Path(stage_plan["destination_dir"])) if merge_plan else False
        variant = base_variant(variant_plan, Path(stage_plan["destination_dir"])) if variant_plan else False
        quantized = quantize(quantize_plan) if quantize_plan else False
        drafted = draft(draft_plan, Path(stage_plan["destination_dir"])) if draft_plan else False
    except PrepareError as exc:
        _report(log, str(exc))
        return exc.exit_code
    except OSError as exc:
        _report(log, f"staging {stage_plan.get('source_uri')} failed: {exc}")
        return 1
    report = json.dumps(
        {"hash": plan.get("content_hash"), "serveDir": serve_dir, "staged": staged, "quantized": quantized}
        | ({"merged": merged} if merge_plan else {})
        | ({"variant": variant} if variant_plan else {})
        | ({"draft": drafted} if draft_plan else {}),
        sort_keys=True,
    )
    _report(log, report)
    print(report)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python3 -m trtfleet_operator.jobs.prepare", description=__doc__)
    p.add_argument("--plan", required=True, help="the prepare plan (JSON)")
    p.add_argument("--termination-log", default="/dev/termination-log")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return run(parser().parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
