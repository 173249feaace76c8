"""The GPUs trtfleet plans engines for: memory, SM architecture and fp8 support.

A TensorRT engine runs only on the SM architecture that built it, so the engine hash uses the SM
(``sm_90``), not the product: an engine built on an H100 is reused on an H200 of the same image.

``memory_bytes`` is the total device memory the driver reports (``nvidia-smi --query-gpu=memory.total``,
MiB x 2^20), which is a little less than the marketing figure. The values are as NVIDIA's
drivers commonly report them, not measured by this project (no GPU was available); B200 is the least
certain. Correct them here if `nvidia-smi` on your nodes disagrees. The ``cpu`` pseudo product stands for
trtfleet's CPU reference engine (``runtime: reference``): it has no device memory, so the capacity
planner gives it :data:`CPU_DEVICE_BUDGET_BYTES` of *simulated* device memory, the same budget the
reference engine uses for its device-tier LoRA cache and KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass

from trtfleet_engines.errors import UnknownGpuError, UnsupportedError

MIB = 1 << 20
GIB = 1 << 30

CPU_PRODUCT = "cpu"
CPU_SM = "cpu"
CPU_DEVICE_BUDGET_BYTES = 4 * GIB
"""Simulated device memory of the ``cpu`` pseudo product (the reference engine's device budget)."""


@dataclass(frozen=True)
class GpuSpec:
    """One GPU product."""

    product: str
    memory_bytes: int
    sm: str
    fp8: bool
    description: str
    memory_bandwidth_bytes_per_s: float = 0.0
    """Peak memory bandwidth (NVIDIA's datasheet figure for the SXM / data-centre part): the denominator of model
    bandwidth utilisation (MBU). The ``cpu`` product's is a pretend figure of one DDR4-3200 channel."""

    @property
    def is_cpu(self) -> bool:
        return self.sm == CPU_SM


GPUS: dict[str, GpuSpec] = {
    spec.product: spec
    for spec in (
        GpuSpec("A10G", 23028 * MIB, "sm_86", False, "NVIDIA A10G (Ampere GA102), 24 GB GDDR6", 600e9),
        GpuSpec("L4", 23034 * MIB, "sm_89", True, "NVIDIA L4 (Ada), 24 GB GDDR6", 300e9),
        GpuSpec("L40S", 46068 * MIB, "sm_89", True, "NVIDIA L40S (Ada), 48 GB GDDR6", 864e9),
        GpuSpec("A100-40GB", 40960 * MIB, "sm_80", False, "NVIDIA A100 40 GB (Ampere GA100)", 1555e9),
        GpuSpec("A100-80GB", 81920 * MIB, "sm_80", False, "NVIDIA A100 80 GB (Ampere GA100)", 2039e9),
        GpuSpec("H100-80GB", 81559 * MIB, "sm_90", True, "NVIDIA H100 80 GB HBM3 (Hopper)", 3.35e12),
        GpuSpec("H200", 143771 * MIB, "sm_90", True, "NVIDIA H200 141 GB HBM3e (Hopper)", 4.8e12),
        GpuSpec("B200", 183359 * MIB, "sm_100", True, "NVIDIA B200 (Blackwell), 192 GB HBM3e", 8e12),
        GpuSpec(CPU_PRODUCT, CPU_DEVICE_BUDGET_BYTES, CPU_SM, False, "trtfleet CPU reference engine", 25.6e9),
    )
}

_ALIASES: dict[str, str] = {
    "H100": "H100-80GB",
    "H100-80GB-HBM3": "H100-80GB",
    "H100-SXM5-80GB": "H100-80GB",
    "H200-141GB": "H200",
    "A100-SXM4-40GB": "A100-40GB",
    "A100-SXM4-80GB": "A100-80GB",
    "A100-PCIE-40GB": "A100-40GB",
    "A100-PCIE-80GB": "A100-80GB",
    "L40S-48GB": "L40S",
}


def _normalise(product: str) -> str:
    name = product.strip().upper().replace(" ", "-").replace("_", "-")
    for prefix in ("NVIDIA-",):
        if name.startswith(prefix):
            name = name[len(prefix) :]
    return name


def known_products() -> tuple[str, ...]:
    return tuple(GPUS)


def lookup_gpu(product: str) -> GpuSpec:
    """The table entry for ``product`` (case-insensitive; ``NVIDIA-`` prefixes and a few aliases accepted)."""
    wanted = _normalise(product)
    by_upper = {name.upper(): spec for name, spec in GPUS.items()}
    if wanted in by_upper:
        return by_upper[wanted]
    if wanted in _ALIASES:
        return GPUS[_ALIASES[wanted]]
    raise UnknownGpuError(product, known_products())


def require_fp8(gpu: GpuSpec, what: str) -> None:
    """Raise when ``what`` (e.g. ``quantization.mode fp8``) needs fp8 and ``gpu`` has none."""
    if not gpu.fp8:
        fp8_gpus = ", ".join(spec.product for spec in GPUS.values() if spec.fp8)
        raise UnsupportedError(
            f"{what} needs a GPU with fp8 (Ada sm_89, Hopper sm_90 or newer) but engine.gpu.product "
            f"{gpu.product} is {gpu.sm}: use quantization int8_weight_only/int4_awq, or one of: {fp8_gpus}"
        )
