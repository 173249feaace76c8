"""The router's discovery client on the real API server: list + watch of N Adapters and N EndpointSlices.

    .venv/bin/python bench/kube_discovery.py [--objects 200] [--rounds 3]

Uses whichever ``trtfleet_router.discovery.kubeclient.KubeClient`` is on the path, so the same script
measures another checkout's client (before/after a change: ``PYTHONPATH=<checkout>:<checkout>/router``).
Per round: the time until both watches delivered their first ``SYNC`` (a list of N objects each), then
the time until they delivered the N MODIFIED events of N status patches of the Adapters and N label
patches of the slices (made by a separate plain aiohttp writer, 16 at a time), and this process's CPU
seconds over the whole round (the writer's share included; it is the same in every checkout).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from trtfleet_router.discovery import kubeclient  # noqa: E402

from bench.kube_client import APPLY, GROUP, MERGE, Handwritten, adapter, endpoint_slice  # noqa: E402
from tests.support.controlplane import ControlPlane  # noqa: E402


async def router_client(kubeconfig: Path) -> Any:
    if hasattr(kubeclient, "load_credentials"):  # the hand-written client before trtfleet.kube
        return kubeclient.KubeClient(kubeclient.kubeconfig_credentials(kubeconfig))
    from trtfleet.kube import KubeSource, load_connection

    source = KubeSource(kubeconfig=str(kubeconfig))
    return kubeclient.KubeClient(source, await load_connection(source))


async def one_round(kubeconfig: Path, ns: str, objects: int) -> tuple[float, float, float]:
    writer = Handwritten(kubeconfig)
    ads, es = f"{GROUP}/namespaces/{ns}/adapters", f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"
    gate = asyncio.Semaphore(16)

    async def send(method: str, path: str, params: dict[str, str] | None, body: Any, content_type: str) -> None:
        async with gate:
            status, _ = await writer.request(method, path, params, body, content_type)
            assert status in (200, 201), (path, status)

    force = {"fieldManager": "bench", "force": "true"}
    await asyncio.gather(
        *(send("PATCH", f"{ads}/a{i:03d}", force, adapter(f"a{i:03d}"), APPLY) for i in range(objects))
    )
    await asyncio.gather(
        *(send("PATCH", f"{es}/s{i:03d}", force, endpoint_slice(f"s{i:03d}", i), APPLY) for i in range(objects))
    )
    client = await router_client(kubeconfig)
    synced, modified = asyncio.Event(), asyncio.Event()
    counts = {"sync": 0, "modified": 0}

    async def follow(path: str, selector: str | None) -> None:
        async for event, payload in client.watch(path, selector):
            if event == kubeclient.SYNC:
                assert len(payload) == objects, len(payload)
                counts["sync"] += 1
                if counts["sync"] == 2:
                    synced.set()
            elif event == "MODIFIED":
                counts["modified"] += 1
                if counts["modified"] == 2 * objects:
                    modified.set()

    cpu, started = time.process_time(), time.perf_counter()
    tasks = [asyncio.create_task(follow(ads, None)), asyncio.create_task(follow(es, "trtfleet.io/basemodel"))]
    await asyncio.wait_for(synced.wait(), 60)
    sync_s = time.perf_counter() - started
    patched = time.perf_counter()
    status = {"status": {"phase": "Pending"}}
    await asyncio.gather(
        *(send("PATCH", f"{ads}/a{i:03d}/status", None, status, MERGE) for i in range(objects)),
        *(send("PATCH", f"{es}/s{i:03d}", None, {"metadata": {"labels": {"r": "1"}}}, MERGE) for i in range(objects)),
    )
    await asyncio.wait_for(modified.wait(), 60)
    watch_s = time.perf_counter() - patched
    cpu_s = time.process_time() - cpu
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await client.close()
    await writer.close()
    return sync_s, watch_s, cpu_s


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--objects", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    rows = []
    with ControlPlane(controller_manager=False) as cp:
        cp.kubectl("apply", "--server-side", "-f", str(ROOT / "crds"))
        cp.wait_established("adapters.trtfleet.io")
        for round_ in range(args.rounds):
            ns = f"discovery-{round_}"
            cp.kubectl("create", "namespace", ns)
            rows.append(asyncio.run(one_round(cp.kubeconfig, ns, args.objects)))
    client = "hand-written" if hasattr(kubeclient, "load_credentials") else "trtfleet.kube"
    sync, watch, cpu = (statistics.median(column) for column in zip(*rows, strict=True))
    print(f"{client}: {args.objects} Adapters + {args.objects} EndpointSlices, median of {args.rounds} rounds: "
          f"list+watch SYNC {sync * 1e3:.0f} ms, {2 * args.objects} MODIFIED delivered {watch * 1e3:.0f} ms, "
          f"process CPU {cpu:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
