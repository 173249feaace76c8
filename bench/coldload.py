"""What one cold adapter load costs a pod, as a client sees it, and so what the router should price.

    .venv/bin/python -m bench.coldload [--runtime tensorrtllm|pytorch] [--adapters 24]

One reference worker (the routing benchmark's: max batch 8, every step at least 20 ms, small LoRA caches)
behind ``trtfleet router``. For each adapter in turn, alone on the worker: a request for it while the worker
does not hold it (cold: on ``tensorrtllm`` the weights travel with it and the worker stores them; on
``pytorch`` the worker reads the PEFT directory from ``lora_path``), then the same request again (warm). The
difference of the two TTFTs is what the load cost; the median over adapters less the bytes the policy
already prices (weights over ``linkBandwidthBytesPerS`` or ``podReadBytesPerS``) is the fixed part, the
``trtfleet.loadOverheadS`` / ``trtfleet.podReadOverheadS`` to configure. The worker's cache holds fewer
adapters than are measured, so the later loads also evict (as they do in a full fleet).

The real routing runs (:mod:`bench.routing`, :mod:`bench.routing_pytorch`) measure it first and configure the
router with it, as a platform team would for its own pods. A mock-free measurement: real tritonserver or the
reference trtllm-serve, the real router, HTTP streaming.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench import report
from bench.realfleet import RealFleet, synthetic_adapters, synthetic_peft_adapters
from bench.realscenario import RealScenario, host_cache_bytes_for
from bench.replay import Sample, stream_one
from bench.traces import TraceRequest

WORK = report.RESULTS / "coldload"
ADAPTERS_DEFAULT = 24
PROMPT_TOKENS = 48  # the routing trace's median prompt
POLICY = "adapter-affinity"  # a warm request goes where its adapter is (one worker: always there)


@dataclass(frozen=True, slots=True)
class ColdLoad:
    """TTFT pairs of one run: ``cold[i]`` and ``warm[i]`` are the same request for adapter ``i``."""

    runtime: str
    cold_s: tuple[float, ...]
    warm_s: tuple[float, ...]
    weights_bytes: int  # one adapter's, as the router prices it
    bytes_per_s: float  # the policy's default bandwidth for that runtime

    @property
    def load_s(self) -> float:
        """Median cold TTFT less warm TTFT over the adapters (what one load adds)."""
        return statistics.median(c - w for c, w in zip(self.cold_s, self.warm_s, strict=True))

    @property
    def overhead_s(self) -> float:
        """The fixed part: :attr:`load_s` less the bytes the policy prices anyway (never below 0)."""
        return max(0.0, self.load_s - self.weights_bytes / self.bytes_per_s)

    def policy_config(self) -> dict[str, float]:
        """The routing config keys (both trtfleet policies' blocks) that price this load."""
        key = "podReadOverheadS" if self.runtime == "pytorch" else "loadOverheadS"
        return {key: round(self.overhead_s, 4)}

    def describe(self) -> str:
        spread = sorted(c - w for c, w in zip(self.cold_s, self.warm_s, strict=True))
        p90 = spread[min(len(spread) - 1, int(0.9 * len(spread)))]
        return (f"{self.runtime}: {len(spread)} adapters, TTFT cold median "
                f"{statistics.median(self.cold_s) * 1e3:.1f} ms, warm {statistics.median(self.warm_s) * 1e3:.1f} ms; "
                f"one load adds {self.load_s * 1e3:.1f} ms "
                f"(p90 {p90 * 1e3:.1f} ms), of which {self.weights_bytes:,} bytes priced at "
                f"{self.weights_bytes / self.bytes_per_s * 1e3:.2f} ms: fixed part {self.overhead_s * 1e3:.1f} ms")


def _fleet(runtime: str, count: int, scenario: RealScenario) -> tuple[RealFleet, int]:
    """One worker and ``count`` adapters (served names ``c0000``...); the adapter's priced bytes."""
    fleet: RealFleet
    if runtime == "pytorch":
        from bench.realfleet_pytorch import serve_fleet

        paths = synthetic_peft_adapters(count, seed=scenario.seed)
        adapters = [(f"c{i:04d}", i + 1, path) for i, path in enumerate(paths)]
        fleet = serve_fleet(POLICY, 1, adapters, WORK / runtime, max_batch_size=scenario.max_batch_size,
                            seed=scenario.seed, min_step_ms=scenario.min_step_ms, max_loras=2,
                            max_cpu_loras=scenario.adapter_pages_per_worker)
    else:
        paths = synthetic_adapters(count, seed=scenario.seed)
        adapters = [(f"c{i:04d}", i + 1, path) for i, path in enumerate(paths)]
        host_bytes, _ = host_cache_bytes_for(scenario.adapter_pages_per_worker)
        fleet = RealFleet(POLICY, 1, adapters, host_bytes, WORK / runtime, max_batch_size=scenario.max_batch_size,
                          seed=scenario.seed, min_step_ms=scenario.min_step_ms)
    return fleet, _priced_bytes(paths[0], runtime)


def _priced_bytes(path: Path, runtime: str) -> int:
    """The bytes the router prices for one load: the converted weights (tensorrtllm) or the PEFT files."""
    if runtime == "pytorch":
        return sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    return (path / "model.lora_weights.npy").stat().st_size


async def _pairs(base_url: str, names: Sequence[str]) -> list[tuple[Sample, Sample]]:
    import aiohttp

    url = f"{base_url}/v1/completions"
    pairs = []
    async with aiohttp.ClientSession() as session:
        for key, name in enumerate(names):
            request = TraceRequest(t_s=0.0, request_id=f"cold-{key}", adapter=name, prompt_tokens=PROMPT_TOKENS,
                                   max_tokens=4)
            cold = await stream_one(session, url, 2 * key, request, 60.0)
            warm = await stream_one(session, url, 2 * key + 1, request, 60.0)
            pairs.append((cold, warm))
    return pairs


def measure(runtime: str = "tensorrtllm", count: int = ADAPTERS_DEFAULT,
            scenario: RealScenario | None = None) -> ColdLoad:
    """Start the fleet, measure ``count`` cold/warm pairs, stop it (see the module docstring)."""
    from trtfleet_router.routing.policies.cold_placement import AdapterPlacementConfig

    scenario = scenario or RealScenario()
    fleet, weights_bytes = _fleet(runtime, count, scenario)
    with fleet:
        pairs = asyncio.run(_pairs(fleet.base_url, [name for name, _, _ in fleet.adapters]))
    failed = [s.error for pair in pairs for s in pair if s.error is not None or s.ttft_s is None]
    if failed:
        raise RuntimeError(f"cold-load measurement: {len(failed)} requests failed ({failed[:3]})")
    defaults = AdapterPlacementConfig()
    bytes_per_s = defaults.pod_read_bytes_per_s if runtime == "pytorch" else defaults.link_bandwidth_bytes_per_s
    return ColdLoad(runtime, tuple(c.ttft_s or 0.0 for c, _ in pairs), tuple(w.ttft_s or 0.0 for _, w in pairs),
                    weights_bytes, bytes_per_s)


def describe_price(load: ColdLoad) -> str:
    """One clause for a report: the measured load and the routing keys it set."""
    keys = ", ".join(f"`{key}: {value:g}`" for key, value in load.policy_config().items())
    return (f"one load adds {load.load_s * 1e3:.1f} ms to TTFT (median over {len(load.cold_s)} adapters, warm "
            f"{statistics.median(load.warm_s) * 1e3:.1f} ms), so both trtfleet policies were given {keys}")


def priced(scenario: RealScenario, runtime: str = "tensorrtllm") -> tuple[RealScenario, ColdLoad]:
    """``scenario`` with the cold-load price measured on its workers now (printed): what the real runs give the
    router, as a platform team would configure it for its own pods."""
    load = measure(runtime, scenario=scenario)
    print(f"  cold load: {load.describe()}", flush=True)
    return dataclasses.replace(scenario, load_price=tuple(load.policy_config().items())), load


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.coldload", description=__doc__.split("\n")[0])
    parser.add_argument("--runtime", choices=("tensorrtllm", "pytorch"), default="tensorrtllm")
    parser.add_argument("--adapters", type=int, default=ADAPTERS_DEFAULT)
    args = parser.parse_args(argv)
    load = measure(args.runtime, args.adapters)
    print(load.describe())
    print(f"routing config: {load.policy_config()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
