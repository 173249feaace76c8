"""Does Triton's dynamic batcher hold a request half a second on a one-instance model? Measured, no TRT-LLM.

    .venv/bin/python -m bench.triton_batcher                    # 40 pairs per variant, execute 20 ms, B 5 ms after A
    .venv/bin/python -m bench.triton_batcher --execute-ms 2 --gap-ms 1

One real ``tritonserver`` (the ``nvidia-pytriton`` wheel's) serves two copies of a trivial Python model, one
instance each, whose ``execute`` is busy for ``--execute-ms``: ``with_batcher`` has a ``dynamic_batching``
block (as TRT-LLM's ``tensorrt_llm`` model and trtfleet's ``tensorrtllm`` rendering have), ``without_batcher``
has none (as trtfleet's reference engine renders since db5cb2b). Each pair: request A, then ``--gap-ms``
later (while A's ``execute`` runs) request B, then ``--idle-ms`` with no request at all, as at a pod that
goes quiet. B's latency is what the batcher costs: Triton's ``Enqueue`` does not wake the batcher while the
only instance is busy, and the end of A's execution wakes it before the instance waits for work again, so
it can sleep out its 500 ms idle timeout (triton-inference-server/core@73aad7c, docs/engine-fidelity.md
row 85). The variants alternate pair by pair, so machine noise hits both alike.

What it cannot say: how often a real ``tensorrtllm`` pod meets the pattern (its ``execute`` only enqueues
into the executor, much shorter than this model's) - ``--execute-ms`` small asks how narrow the window is.
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from trtfleet_engines.reference.repository import BOOTSTRAP_FILE, MODELS_SOURCE_DIR
from trtfleet_engines.triton import pbtxt

from bench import report
from bench.simstats import percentile

WORK = report.RESULTS / "triton_batcher"
VARIANTS = ("with_batcher", "without_batcher")
STALL_MS = 400.0
"""B latencies at or over this count as the batcher's idle timeout (500 ms) rather than a busy instance."""

_MODEL = '''
import json
import time

import _trtfleet_bootstrap  # noqa: F401  (the worker's site dirs first: numpy)
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.busy_s = float(params["execute_ms"]["string_value"]) / 1000.0

    def execute(self, requests):
        end = time.perf_counter() + self.busy_s
        while time.perf_counter() < end:
            pass
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x.astype(np.int32))]))
        return out
'''


@dataclass(frozen=True)
class Scenario:
    pairs: int = 40
    execute_ms: float = 20.0
    gap_ms: float = 5.0
    idle_ms: float = 700.0


def model_config(name: str, *, batcher: bool, execute_ms: float) -> str:
    """A one-instance CPU Python model; ``batcher`` adds TRT-LLM's kind of ``dynamic_batching`` block."""
    block = "\n".join(pbtxt.dynamic_batching(max_queue_delay_microseconds=100, max_queue_size=64)) + "\n"
    return (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 8\n'
        + (block if batcher else "")
        + 'input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        + 'output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        + "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
        + f'parameters: {{ key: "execute_ms" value: {{ string_value: "{execute_ms:g}" }} }}\n'
    )


def write_repository(root: Path, execute_ms: float) -> Path:
    repo = root / "models"
    for name in VARIANTS:
        version = repo / name / "1"
        version.mkdir(parents=True)
        (version / "model.py").write_text(_MODEL, encoding="utf-8")
        shutil.copyfile(MODELS_SOURCE_DIR / BOOTSTRAP_FILE, version / BOOTSTRAP_FILE)
        (repo / name / "config.pbtxt").write_text(
            model_config(name, batcher=name == "with_batcher", execute_ms=execute_ms), encoding="utf-8"
        )
    return repo


def summarize(latencies_ms: Sequence[float]) -> dict[str, float | int]:
    ordered = sorted(latencies_ms)
    return {
        "pairs": len(ordered),
        "b_p50_ms": round(percentile(ordered, 50), 1),
        "b_p90_ms": round(percentile(ordered, 90), 1),
        "b_max_ms": round(ordered[-1], 1),
        "stalls": sum(1 for value in ordered if value >= STALL_MS),
    }


def table(rows: dict[str, dict[str, float | int]]) -> str:
    lines = ["| model | pairs | B p50 ms | B p90 ms | B max ms | B at 400 ms or more |", "|---|---|---|---|---|---|"]
    for name, row in rows.items():
        lines.append(
            f"| {name} | {row['pairs']} | {row['b_p50_ms']:g} | {row['b_p90_ms']:g} | {row['b_max_ms']:g} | "
            f"{row['stalls']} |"
        )
    return "\n".join(lines)


def _infer_ms(url: str, model: str, value: int) -> float:
    """One KServe v2 HTTP inference (plain ``http.client``: one connection per call, safe from any thread)."""
    host, port = url.rsplit(":", 1)
    body = json.dumps({"inputs": [{"name": "X", "shape": [1, 1], "datatype": "INT32", "data": [value]}]})
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        start = time.perf_counter()
        connection.request("POST", f"/v2/models/{model}/infer", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        payload = response.read()
        elapsed = (time.perf_counter() - start) * 1000.0
    finally:
        connection.close()
    if response.status != 200:
        raise RuntimeError(f"{model}: HTTP {response.status}: {payload[:200]!r}")
    return elapsed


def run(scenario: Scenario) -> dict[str, list[float]]:
    from trtfleet_engines.reference.server import start_worker

    latencies: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="trtfleet-batcher-") as tmp:
        repo = write_repository(Path(tmp), scenario.execute_ms)
        with start_worker(repo, on_stub_death=None) as worker:
            url = worker.http_url
            for name in VARIANTS:  # warm both stubs up
                _infer_ms(url, name, 0)
            time.sleep(scenario.idle_ms / 1000.0)
            for index in range(scenario.pairs * len(VARIANTS)):
                name = VARIANTS[index % len(VARIANTS)]
                a = threading.Thread(target=_infer_ms, args=(url, name, index))
                a.start()
                time.sleep(scenario.gap_ms / 1000.0)
                latencies[name].append(_infer_ms(url, name, index))
                a.join()
                time.sleep(scenario.idle_ms / 1000.0)
    return latencies


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=Scenario.pairs)
    parser.add_argument("--execute-ms", type=float, default=Scenario.execute_ms,
                        help="how long the model's execute keeps its one instance busy")
    parser.add_argument("--gap-ms", type=float, default=Scenario.gap_ms, help="from request A to request B")
    parser.add_argument("--idle-ms", type=float, default=Scenario.idle_ms, help="quiet time after each pair")
    args = parser.parse_args(argv)
    if args.pairs < 1 or min(args.execute_ms, args.gap_ms, args.idle_ms) < 0:
        parser.error("--pairs at least 1, times not negative")
    scenario = Scenario(args.pairs, args.execute_ms, args.gap_ms, args.idle_ms)
    latencies = run(scenario)
    rows = {name: summarize(values) for name, values in latencies.items()}
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / "results.json").write_text(
        json.dumps({"scenario": asdict(scenario), "rows": rows, "latencies_ms": latencies, "machine": report.machine()},
                   indent=2)
    )
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
