#!/usr/bin/env python3
"""Regenerate the tiny reference Llama, its sample LoRA adapters and the LoRA test fixtures.

Run with the throwaway fixture venv (torch + transformers + peft), never in tests:

    "$(hack/fixture-venv.sh)" hack/gen_reference_assets.py [--reuse-base] [--adapters reverse ...]

(about 8 minutes on an idle 2-core machine; ``--reuse-base`` keeps the committed base model and
``--adapters`` retrains only the named adapters, re-deriving the others' expected outputs).

Deterministic: fixed seeds, one torch thread count (``--threads``, default 1); torch's CPU kernels
may still round differently on another CPU, so a regeneration is reviewed like code.

Writes (all committed, together well under 3 MB):
  engines/trtfleet_engines/reference/assets/tiny-llama/{config.json, model.safetensors}
  engines/trtfleet_engines/reference/assets/adapters/{upper,reverse,json}/{adapter_config.json,
      adapter_model.safetensors}                      real PEFT output
  tests/fixtures/lora/expected_outputs.json           greedy outputs + last-position logits of the real
                                                      transformers/peft models, held-out accuracy
  tests/fixtures/lora/<case>/{adapter_config.json, adapter_model.safetensors, expected.json}
      rslora        use_rslora=true, random weights
      rank_pattern  rank_pattern + alpha_pattern (PEFT regex-suffix matching, first key wins)
      fused         the `upper` adapter rewritten with fused qkv_proj / gate_up_proj keys (HF order
                    [q;k;v] and [gate;up], block-diagonal B): same function, so its expected logits
                    are those of the real PEFT `upper` model

The model: a Llama (RMSNorm, RoPE, GQA, SwiGLU) over a byte vocabulary, trained to echo its prompt:
``<bos> prompt <sep>`` -> ``prompt <eos>``. Adapters (r=8, alpha=16, all seven linear modules):
``upper`` echoes in upper case, ``reverse`` echoes the characters reversed, ``json`` answers
``{"echo": "<prompt>"}``. The base model is trained on lowercase prompts, then (curriculum) also on
mixed-case prompts with digits and punctuation; the adapters on lowercase prompts.

The tasks, batches, training loop and decoding live in hack/reference_training.py; writing files and
directories in hack/reference_files.py.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import numpy as np
import peft
import torch
import transformers
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.numpy import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "engines"))

from reference_files import clean_adapter_config, replace_dir, save_adapter, write_json  # noqa: E402
from reference_training import (  # noqa: E402  (hack/ is this script's directory)
    MAX_NEW_TOKENS,
    accuracy,
    greedy,
    last_logits,
    log,
    random_prompt,
    train,
)
from trtfleet_engines.reference import numpy_llama as nl  # noqa: E402
from trtfleet_engines.reference.tokenizer import (  # noqa: E402
    BOS_ID,
    EOS_ID,
    PAD_ID,
    SEP_ID,
    VOCAB_SIZE,
    decode,
    prompt_ids,
)

ASSETS = REPO / "engines" / "trtfleet_engines" / "reference" / "assets"
FIXTURES = REPO / "tests" / "fixtures" / "lora"

# Keep in step with TINY_LLAMA_DIMENSIONS in the engines package.
DIMENSIONS = {
    "hidden_size": 64,
    "intermediate_size": 176,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 256,
}
TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SAMPLE_ADAPTERS = ("upper", "reverse", "json")
# Reversal needs new attention (the token *before* each match), so it trains longer than the others.
ADAPTER_STEPS = {"upper": 600, "reverse": 2500, "json": 600}

SAMPLE_PROMPTS = [
    "hello world",
    "the quick brown fox",
    "lora adapters on triton",
    "abc",
    "kubernetes operator",
    "one base model many adapters",
]
LOGIT_PROMPTS = ["hello world", "tiny llama"]


def save_base(model: LlamaForCausalLM, target: Path) -> None:
    def build(out: Path) -> None:
        tensors = {k: v.detach().contiguous().numpy().astype(np.float32) for k, v in model.state_dict().items()}
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        config = model.config.to_dict()
        config.pop("_name_or_path", None)
        # Readers on transformers 4.x (TRT-LLM's converter) look for these top-level names.
        config["rope_theta"] = DIMENSIONS["rope_theta"]
        config["torch_dtype"] = "float32"
        write_json(out / "config.json", dict(sorted(config.items())))

    replace_dir(target, build)


def numpy_check(model_dir: Path, adapter: nl.AdapterWeights | None, prompt: str, expected: list[float]) -> float:
    """Max |numpy - torch| of the last-position logits, as a sanity check before writing fixtures."""
    tiny = nl.TinyLlama(nl.LlamaWeights.load(model_dir))
    state = tiny.new_sequence()
    logits = tiny.step([nl.StepRow(state, np.asarray(prompt_ids(prompt), np.int32), adapter)])[0]
    return float(np.abs(logits - np.asarray(expected, np.float32)).max())


def adapter_from_peft_dir(config: nl.LlamaConfig, adapter_dir: Path) -> nl.AdapterWeights:
    """Unfused PEFT dir -> numpy AdapterWeights (uniform alpha/r; only used for the sanity check)."""
    cfg = json.loads((adapter_dir / "adapter_config.json").read_text())
    scale = cfg["lora_alpha"] / cfg["r"]
    ids = {"q_proj": 1, "k_proj": 2, "v_proj": 3, "o_proj": 4, "gate_proj": 5, "down_proj": 6, "up_proj": 7}
    tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
    modules = {}
    for key, a in tensors.items():
        if ".lora_A." not in key:
            continue
        parts = key.split(".")
        layer, name = int(parts[parts.index("layers") + 1]), parts[-3]
        b = tensors[key.replace(".lora_A.", ".lora_B.")] * scale
        modules[(layer, ids[name])] = nl.LoraLayerWeights(a.astype(np.float32), b.astype(np.float32))
    return nl.AdapterWeights(config, modules)


def build_base_model(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        tie_word_embeddings=False,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        **DIMENSIONS,
    )
    return LlamaForCausalLM(config)


def new_adapter(base: LlamaForCausalLM, seed: int, **overrides: object) -> PeftModel:
    torch.manual_seed(seed)
    settings: dict[str, object] = {
        "r": 8,
        "lora_alpha": 16,
        "lora_dropout": 0.0,
        "target_modules": TARGET_MODULES,
        "task_type": "CAUSAL_LM",
    }
    settings.update(overrides)
    return get_peft_model(base, LoraConfig(**settings))


def randomize_lora(peft_model: PeftModel, seed: int, std: float) -> None:
    """Random A and B (std ``std``) for the proof cases whose behaviour does not matter, only the maths."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(peft_model.named_parameters()):
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * std)


def fuse_adapter(src: Path, target: Path) -> None:
    """Rewrite an unfused r=8 adapter with fused qkv_proj / gate_up_proj keys computing the same function.

    A_qkv = [A_q; A_k; A_v] (rank 24), B_qkv = blockdiag(B_q, B_k, B_v) with HF's [q; k; v] rows;
    A_gate_up = [A_gate; A_up] (rank 16), B_gate_up = blockdiag(B_gate, B_up) with HF's [gate; up] rows.
    rank_pattern / alpha_pattern keep alpha / r = 2 for every module.
    """
    tensors = load_file(str(src / "adapter_model.safetensors"))
    config = json.loads((src / "adapter_config.json").read_text())
    prefix = "base_model.model.model.layers"
    out: dict[str, np.ndarray] = {}
    for layer in range(DIMENSIONS["num_hidden_layers"]):
        for block, parts, fused in (
            ("self_attn", ["q_proj", "k_proj", "v_proj"], "qkv_proj"),
            ("mlp", ["gate_proj", "up_proj"], "gate_up_proj"),
        ):
            a = [tensors[f"{prefix}.{layer}.{block}.{p}.lora_A.weight"] for p in parts]
            b = [tensors[f"{prefix}.{layer}.{block}.{p}.lora_B.weight"] for p in parts]
            big_b = np.zeros((sum(x.shape[0] for x in b), sum(x.shape[1] for x in b)), np.float32)
            row = col = 0
            for piece in b:
                big_b[row : row + piece.shape[0], col : col + piece.shape[1]] = piece
                row, col = row + piece.shape[0], col + piece.shape[1]
            out[f"{prefix}.{layer}.{block}.{fused}.lora_A.weight"] = np.concatenate(a)
            out[f"{prefix}.{layer}.{block}.{fused}.lora_B.weight"] = big_b
        for block, name in (("self_attn", "o_proj"), ("mlp", "down_proj")):
            for which in ("A", "B"):
                key = f"{prefix}.{layer}.{block}.{name}.lora_{which}.weight"
                out[key] = tensors[key]

    def build(staging: Path) -> None:
        save_file(dict(sorted(out.items())), str(staging / "adapter_model.safetensors"), metadata={"format": "pt"})
        config.update(
            target_modules=sorted(["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]),
            rank_pattern={"qkv_proj": 24, "gate_up_proj": 16},
            alpha_pattern={"qkv_proj": 48, "gate_up_proj": 32},
        )
        write_json(staging / "adapter_config.json", dict(sorted(config.items())))

    replace_dir(target, build)


def load_or_train_base(args: argparse.Namespace, heldout: list[str]) -> tuple[LlamaForCausalLM, float]:
    model_dir = ASSETS / "tiny-llama"
    if args.reuse_base and (model_dir / "model.safetensors").is_file():
        log(f"reusing {model_dir}")
        base = LlamaForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32).eval()
    else:
        base = build_base_model(seed=0)
        log(f"base parameters: {sum(p.numel() for p in base.parameters())}")
        train(base, "base", steps=args.base_steps, lr=3e-3, batch_size=args.batch_size, seed=1)
        save_base(base, model_dir)
    acc = accuracy(base, "base", heldout)
    log(f"base exact-match {acc:.3f}")
    for param in base.parameters():
        param.requires_grad_(False)
    return base, acc


def expected_for(model: torch.nn.Module, task: str) -> dict[str, object]:
    outputs = [greedy(model, p) for p in SAMPLE_PROMPTS]
    return {
        "task": task,
        "outputs": [decode(ids) for ids in outputs],
        "output_ids": outputs,
        "logits": [last_logits(model, p) for p in LOGIT_PROMPTS],
    }


def proof_case(base: LlamaForCausalLM, name: str, seed: int, std: float, **overrides: object) -> None:
    """A randomly initialised adapter with an unusual config, saved with the real PEFT model's logits."""
    base_logits = np.asarray(last_logits(base, LOGIT_PROMPTS[0]))  # before PEFT wraps base in place
    model = new_adapter(base, seed=seed, **overrides)
    randomize_lora(model, seed=seed + 1, std=std)
    model.eval()
    target = FIXTURES / name

    def build(staging: Path) -> None:
        model.save_pretrained(str(staging), safe_serialization=True)
        (staging / "README.md").unlink(missing_ok=True)
        clean_adapter_config(staging / "adapter_config.json")
        write_json(
            staging / "expected.json",
            {
                "prompts": LOGIT_PROMPTS,
                "logits": [last_logits(model, p) for p in LOGIT_PROMPTS],
                "greedy_ids": [greedy(model, p, 24) for p in LOGIT_PROMPTS],
            },
        )

    replace_dir(target, build)
    moved = np.abs(np.asarray(last_logits(model, LOGIT_PROMPTS[0])) - base_logits).max()
    log(f"proof case {name}: max |logit change| vs base {moved:.3f}")
    model.unload()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--base-steps", type=int, default=2000)
    parser.add_argument("--adapter-steps", type=int, help="override the per-adapter ADAPTER_STEPS")
    parser.add_argument("--batch-size", type=int, default=48, help="base model batch size")
    parser.add_argument("--adapter-batch-size", type=int, default=32)
    parser.add_argument("--heldout", type=int, default=200, help="held-out prompts per model for accuracy")
    parser.add_argument("--reuse-base", action="store_true", help="keep the committed base model, redo the rest")
    parser.add_argument(
        "--adapters", nargs="*", default=list(SAMPLE_ADAPTERS), help="adapters to (re)train; others are reused"
    )
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    heldout_rng = random.Random(20261121)
    heldout = [random_prompt(heldout_rng) for _ in range(args.heldout)]
    started = time.monotonic()
    versions = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
    }

    base, base_acc = load_or_train_base(args, heldout)
    model_dir = ASSETS / "tiny-llama"
    expected: dict[str, object] = {"base": expected_for(base, "base")}
    accuracy_by_model = {"base": base_acc}
    config = nl.LlamaConfig.from_hf_config(model_dir)
    drift = numpy_check(model_dir, None, LOGIT_PROMPTS[0], expected["base"]["logits"][0])  # type: ignore[index]
    log(f"numpy vs torch base logits max diff {drift:.2e}")

    for seed, name in enumerate(SAMPLE_ADAPTERS, start=10):
        if name in args.adapters:
            model = new_adapter(base, seed=seed)
            train(
                model,
                name,
                steps=args.adapter_steps or ADAPTER_STEPS[name],
                lr=4e-3,
                batch_size=args.adapter_batch_size,
                seed=seed + 100,
            )
            save_adapter(model, ASSETS / "adapters" / name)
        else:  # keep the committed adapter, recompute its expected outputs
            model = PeftModel.from_pretrained(base, str(ASSETS / "adapters" / name)).eval()
        accuracy_by_model[name] = accuracy(model, name, heldout)
        log(f"{name} exact-match {accuracy_by_model[name]:.3f} ({time.monotonic() - started:.0f} s)")
        for p in SAMPLE_PROMPTS[:3]:
            log(f"  {p!r} -> {decode(greedy(model, p))!r}")
        expected[name] = expected_for(model, name)
        adapter = adapter_from_peft_dir(config, ASSETS / "adapters" / name)
        drift = numpy_check(model_dir, adapter, LOGIT_PROMPTS[0], expected[name]["logits"][0])  # type: ignore[index]
        log(f"numpy vs torch {name} logits max diff {drift:.2e}")
        model.unload()

    proof_case(base, "rslora", seed=40, std=0.08, use_rslora=True, r=16, lora_alpha=8)
    proof_case(
        base,
        "rank_pattern",
        seed=50,
        std=0.08,
        rank_pattern={
            "layers\\.1\\.self_attn\\.q_proj": 2,
            "q_proj": 4,
            "model.layers.0.mlp.down_proj": 6,
            "k_proj": 3,
        },
        alpha_pattern={"v_proj": 4, "layers.0.self_attn.o_proj": 64},
    )
    fuse_adapter(ASSETS / "adapters" / "upper", FIXTURES / "fused")
    write_json(
        FIXTURES / "fused" / "expected.json",
        {
            "prompts": LOGIT_PROMPTS,
            "logits": expected["upper"]["logits"],  # type: ignore[index]
            "source": "the real PEFT `upper` adapter (same function, unfused)",
        },
    )

    write_json(
        FIXTURES / "expected_outputs.json",
        {
            "generated_by": "hack/gen_reference_assets.py",
            "versions": versions,
            "token_ids": {"pad": PAD_ID, "bos": BOS_ID, "eos": EOS_ID, "sep": SEP_ID, "vocab": VOCAB_SIZE},
            "prompts": SAMPLE_PROMPTS,
            "logit_prompts": LOGIT_PROMPTS,
            "max_new_tokens": MAX_NEW_TOKENS,
            "heldout_prompts": len(heldout),
            "heldout_exact_match": accuracy_by_model,
            "models": expected,
        },
    )
    log(f"done in {time.monotonic() - started:.0f} s; accuracy {accuracy_by_model}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
