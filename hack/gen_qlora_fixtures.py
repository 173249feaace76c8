#!/usr/bin/env python3
"""Regenerate tests/fixtures/qlora/: bitsandbytes' own 4-bit quantization of small tensors, on CPU.

Run with a throwaway venv, never in tests (the tests compare trtfleet's numpy code with these files):

    python3.11 -m venv .cache/qlora-venv
    .cache/qlora-venv/bin/pip install torch bitsandbytes==0.50.2 safetensors numpy
    PYTHONPATH=engines .cache/qlora-venv/bin/python hack/gen_qlora_fixtures.py

For each case (input tensor x dtype x quant type x block size x double quantization) it writes the input,
``quantize_4bit``'s packed codes and absmax (or, with double quantization, the 8-bit absmax codes, their
block absmax and the offset) and the dequantized output of bitsandbytes' reference kernel, all as raw bits
in one safetensors file, plus bitsandbytes' NF4, FP4 and 8-bit dynamic code books; the last also to
engines/trtfleet_engines/lora/bnb_dynamic_code.json (torch.linspace's vectorized CPU kernel rounds some of
its entries unlike the scalar formula, so trtfleet ships bitsandbytes' own table). Inputs: a weight of the
committed tiny Llama (so the fixtures cover real weights) and a seeded normal tensor whose size is not a
multiple of the block.
"""

from __future__ import annotations

import json
from pathlib import Path

import bitsandbytes
import bitsandbytes.functional as bnbf
import numpy as np
import torch
from bitsandbytes.backends.default.ops import _dequantize_4bit_compute
from safetensors.numpy import load_file, save_file

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "tests" / "fixtures" / "qlora"
TINY = REPO / "engines" / "trtfleet_engines" / "reference" / "assets" / "tiny-llama" / "model.safetensors"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(BITS[t.dtype]).numpy().copy()


def inputs() -> dict[str, torch.Tensor]:
    weight = load_file(str(TINY))["model.layers.0.self_attn.o_proj.weight"]  # [64, 64] float32
    generator = torch.Generator().manual_seed(17)
    return {"o_proj": torch.from_numpy(weight.copy()), "odd": torch.randn(7, 50, generator=generator) * 0.02}


def main() -> None:
    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, np.ndarray] = {
        "code.nf4": bnbf.get_4bit_type("nf4", device="cpu").numpy(),
        "code.fp4": bnbf.get_4bit_type("fp4", device="cpu").numpy(),
        "code.dynamic": bnbf.create_dynamic_map().numpy(),
    }
    cases = []
    for source, full in inputs().items():
        for dtype_name, dtype in DTYPES.items():
            x = full.to(dtype)
            tensors[f"{source}.{dtype_name}.input"] = bits(x)
            for quant_type in ("nf4", "fp4"):
                for blocksize in (64, 128):
                    for double in (False, True):
                        name = f"{source}.{dtype_name}.{quant_type}.{blocksize}.{'dq' if double else 'plain'}"
                        packed, state = bnbf.quantize_4bit(
                            x, blocksize=blocksize, compress_statistics=double, quant_type=quant_type
                        )
                        api = bnbf.dequantize_4bit(packed, state)
                        absmax = state.absmax
                        if double:
                            absmax = bnbf.dequantize_blockwise(state.absmax, state.state2) + state.offset
                        # bitsandbytes' reference dequantization (its default kernel, the CUDA kernel's
                        # semantics: flat blocks). The CPU C kernel restarts blocks at every row when a row is
                        # not a multiple of the block size; the json says where the two differ.
                        out = _dequantize_4bit_compute(packed.reshape(-1), absmax, state.code, blocksize, x.shape,
                                                       dtype)
                        tensors[f"{name}.packed"] = packed.numpy().reshape(-1)
                        tensors[f"{name}.absmax"] = state.absmax.numpy()
                        if double:
                            tensors[f"{name}.absmax2"] = state.state2.absmax.numpy()
                            tensors[f"{name}.offset"] = state.offset.reshape(1).numpy()
                        tensors[f"{name}.output"] = bits(out)
                        cases.append({"name": name, "input": f"{source}.{dtype_name}.input", "shape": list(x.shape),
                                      "dtype": dtype_name, "quantType": quant_type, "blocksize": blocksize,
                                      "doubleQuant": double, "cpuKernelAgrees": bool(torch.equal(api, out))})
    save_file(tensors, str(OUT / "bnb_4bit.safetensors"))
    dynamic = tensors["code.dynamic"].astype(np.float32).view(np.uint32)
    table = {"generated_by": "hack/gen_qlora_fixtures.py (bitsandbytes.functional.create_dynamic_map())",
             "bitsandbytes": bitsandbytes.__version__, "float32_bits": [f"{int(v):08x}" for v in dynamic]}
    (REPO / "engines" / "trtfleet_engines" / "lora" / "bnb_dynamic_code.json").write_text(
        json.dumps(table, indent=0) + "\n")
    meta = {"generated_by": "hack/gen_qlora_fixtures.py",
            "versions": {"bitsandbytes": bitsandbytes.__version__, "torch": torch.__version__},
            "cases": cases}
    (OUT / "bnb_4bit.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"{len(cases)} cases, {sum(t.nbytes for t in tensors.values())} bytes")


if __name__ == "__main__":
    main()
