#!/usr/bin/env python3
"""Train a tiny QLoRA adapter on the committed tiny Llama's NF4 base and record what the real QLoRA model answers.

Run with the throwaway venv of hack/gen_qlora_fixtures.py plus transformers, peft and accelerate, never in tests:

    .cache/qlora-venv/bin/pip install transformers peft accelerate
    .cache/qlora-venv/bin/python hack/gen_qlora_adapter.py

The base is loaded by transformers with ``BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
bnb_4bit_compute_dtype=float32)`` (block size 64, no double quantization: bitsandbytes' defaults), on CPU;
a LoRA adapter (r=8, alpha=16, the seven linear modules) is trained on the ``upper`` task exactly as
hack/gen_reference_assets.py trains the sample ``upper`` adapter. Writes tests/fixtures/qlora/upper-nf4/:
the PEFT adapter and ``expected.json`` (the QLoRA model's last-position logits and greedy outputs).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch
from transformers import BitsAndBytesConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen_reference_assets as g

OUT = g.REPO / "tests" / "fixtures" / "qlora" / "upper-nf4"
STEPS = 600


def reference_kernels() -> None:
    """bitsandbytes' CPU 4-bit kernels restart blocks at every row when a row is not a multiple of the block size
    (the tiny model's down_proj rows are 176 wide): use its reference dequantization (the CUDA kernel's flat
    blocks, what a GPU QLoRA run sees) for dequantize_4bit and the one-token gemv."""
    from bitsandbytes.backends.default.ops import _dequantize_4bit_compute
    from bitsandbytes.backends.utils import _get_4bit_code

    def dequantize(A: torch.Tensor, absmax: torch.Tensor, blocksize: int, quant_type: str, shape: list[int],
                   dtype: torch.dtype) -> torch.Tensor:
        A = A if A.dtype == torch.uint8 else A.view(torch.uint8)
        return _dequantize_4bit_compute(A.reshape(-1), absmax, _get_4bit_code(quant_type, A.device), blocksize,
                                        shape, dtype)

    def gemv(A: torch.Tensor, B: torch.Tensor, shapeB: list[int], absmax: torch.Tensor, code: torch.Tensor,
             blocksize: int) -> torch.Tensor:
        quant_type = "fp4" if code[1] > 0 else "nf4"
        return torch.nn.functional.linear(A, dequantize(B, absmax, blocksize, quant_type, shapeB, A.dtype))

    torch.library.register_kernel("bitsandbytes::dequantize_4bit", "cpu", dequantize)
    torch.library.register_kernel("bitsandbytes::gemv_4bit", "cpu", gemv)


def main() -> int:
    torch.set_num_threads(1)
    reference_kernels()
    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                      bnb_4bit_compute_dtype=torch.float32, bnb_4bit_use_double_quant=False)
    base = LlamaForCausalLM.from_pretrained(str(g.ASSETS / "tiny-llama"), quantization_config=quantization,
                                            torch_dtype=torch.float32, device_map={"": "cpu"})
    for module in base.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False  # no repacking for bitsandbytes' CPU inference kernel
    model = g.new_adapter(base, seed=11)
    g.train(model, "upper", steps=STEPS, lr=4e-3, batch_size=32, seed=12)
    expected = {
        "generated_by": "hack/gen_qlora_adapter.py",
        "baseQuantization": {"quantType": "nf4", "blockSize": 64, "doubleQuant": False, "computeDtype": "float32"},
        "prompts": g.SAMPLE_PROMPTS,
        "logits": [g.last_logits(model, p) for p in g.SAMPLE_PROMPTS],
        "output_ids": [g.greedy(model, p) for p in g.SAMPLE_PROMPTS],
    }
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        OUT.mkdir(parents=True, exist_ok=True)
        for name in ("adapter_config.json", "adapter_model.safetensors"):
            (OUT / name).write_bytes((Path(tmp) / name).read_bytes())
    g.clean_adapter_config(OUT / "adapter_config.json")
    (OUT / "expected.json").write_text(json.dumps(expected) + "\n")
    print([g.decode(ids) for ids in expected["output_ids"]])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
