"""Kubernetes client libraries on the real API server: the calls trtfleet makes, per library.

    .venv/bin/python bench/kube_client.py [--objects 200] [--rounds 2] [--libraries ...]

Starts a ControlPlane (tests/support/controlplane.py: real etcd + kube-apiserver, no controllers), the
trtfleet CRDs, and for each library in a fresh namespace: server-side apply of N Adapters and N
EndpointSlices, lists of both (``--lists`` times), a watch on the Adapters opened before N
status-subresource merge patches (latency until the watch delivered all N), and N compare-and-swap merge
patches (GET, patch with its resourceVersion, then the same stale resourceVersion again, which must
be a 409). Requests run ``--concurrency`` at a time, as the operator's reconciles do. Each library is
driven through its raw request path on plain dicts (what trtfleet's layer needs; no generated models):

* ``handwritten``: an aiohttp session with an ``ssl`` context built from the kubeconfig's files, the
  shape of the hand-written clients trtfleet had before ``trtfleet.kube``;
* ``kubernetes_asyncio``: :class:`trtfleet.kube.KubeApi` (the library's config loader and aiohttp session,
  without ``trust_env``); ``kubernetes_asyncio+trust_env``: the same with the session's ``trust_env`` as the
  library sets it (a proxy and ``.netrc`` lookup in a thread per request);
* ``lightkube``: the httpx client lightkube's config adapter builds (its auth flows, TLS);
* ``kr8s``: ``Api.call_api`` (its auth, httpx session).

Per phase: client CPU seconds (``time.process_time``, this process only: the API server runs apart) per
call, and per-call wall latency p50/p95. Rounds alternate the library order; the table has each
library's median over rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import ssl
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp
import orjson
import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support.controlplane import ControlPlane  # noqa: E402

if TYPE_CHECKING:
    from trtfleet.kube import KubeApi

Obj = dict[str, Any]
GROUP = "/apis/trtfleet.io/v1alpha1"
APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
LIBRARIES = ("handwritten", "kubernetes_asyncio", "kubernetes_asyncio+trust_env", "lightkube", "kr8s")


class Transport(Protocol):
    async def request(
        self, method: str, path: str, params: dict[str, str] | None, body: Any, content_type: str
    ) -> tuple[int, Obj]: ...

    def watch(self, path: str, params: dict[str, str]) -> AsyncIterator[Obj]: ...

    async def close(self) -> None: ...


# ------------------------------------------------------------------------------------------ transports
class Handwritten:
    def __init__(self, kubeconfig: Path) -> None:
        config = yaml.safe_load(kubeconfig.read_text())
        cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
        context = ssl.create_default_context(cafile=cluster["certificate-authority"])
        context.load_cert_chain(user["client-certificate"], user["client-key"])
        self.server = cluster["server"]
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context, limit=32))

    async def request(
        self, method: str, path: str, params: dict[str, str] | None, body: Any, content_type: str
    ) -> tuple[int, Obj]:
        data = None if body is None else orjson.dumps(body)
        headers = {"Accept": "application/json", "Content-Type": content_type}
        async with self.session.request(method, self.server + path, params=params, data=data, headers=headers) as r:
            raw = await r.read()
            return r.status, orjson.loads(raw) if raw else {}

    async def watch(self, path: str, params: dict[str, str]) -> AsyncIterator[Obj]:
        async with self.session.get(self.server + path, params=params, timeout=aiohttp.ClientTimeout(None)) as r:
            async for line in r.content:
                if line.strip():
                    yield orjson.loads(line)

    async def close(self) -> None:
        await self.session.close()


class KubernetesAsyncio:
    def __init__(self, api: KubeApi) -> None:
        self.api = api

    async def request(
        self, method: str, path: str, params: dict[str, str] | None, body: Any, content_type: str
    ) -> tuple[int, Obj]:
        from trtfleet.kube import KubeApiError

        try:
            return 200, await self.api.request(method, path, params=params, body=body, content_type=content_type)
        except KubeApiError as exc:
            return exc.status, {"reason": exc.reason}

    async def watch(self, path: str, params: dict[str, str]) -> AsyncIterator[Obj]:
        async for event in self.api.stream(path, params, read_timeout_s=600):
            yield event

    async def close(self) -> None:
        await self.api.close()


class Lightkube:
    def __init__(self, kubeconfig: Path) -> None:
        from lightkube.config.client_adapter import AsyncClient, ConnectionParams
        from lightkube.config.kubeconfig import KubeConfig

        self.client = AsyncClient(KubeConfig.from_file(kubeconfig).get(), ConnectionParams(timeout=None))

    async def request(
        self, method: str, path: str, params: dict[str, str] | None, body: Any, content_type: str
    ) -> tuple[int, Obj]:
        content = None if body is None else orjson.dumps(body)
        headers = {"Accept": "application/json", "Content-Type": content_type}
        r = await self.client.request(method, path, params=params, content=content, headers=headers)
        return r.status_code, orjson.loads(r.content) if r.content else {}

    async def watch(self, path: str, params: dict[str, str]) -> AsyncIterator[Obj]:
        async with self.client.stream("GET", path, params=params) as r:
            async for line in r.aiter_lines():
                if line.strip():
                    yield orjson.loads(line)

    async def close(self) -> None:
        await self.client.aclose()


def _kr8s_parts(path: str) -> Obj:
    """``/apis/g/v/namespaces/ns/rest`` -> kr8s's (base, version, namespace, url)."""
    parts = path.strip("/").split("/")
    base, rest = ("/api", parts[1:]) if parts[0] == "api" else (f"/apis/{parts[1]}", parts[2:])
    version, rest = rest[0], rest[1:]
    namespace = rest[1] if rest[:1] == ["namespaces"] else None
    url = "/".join(rest[2:] if namespace else rest)
    return {"base": base, "version": version, "namespace": namespace, "url": url}


class Kr8s:
    def __init__(self, api: Any) -> None:
        self.api = api

    async def request(
        self, method: str, path: str, params: dict[str, str] | None, body: Any, content_type: str
    ) -> tuple[int, Obj]:
        content = None if body is None else orjson.dumps(body)
        headers = {"Accept": "application/json", "Content-Type": content_type}
        async with self.api.call_api(
            method, **_kr8s_parts(path), params=params, content=content, headers=headers, raise_for_status=False
        ) as r:
            return r.status_code, orjson.loads(r.content) if r.content else {}

    async def watch(self, path: str, params: dict[str, str]) -> AsyncIterator[Obj]:
        async with self.api.call_api("GET", **_kr8s_parts(path), params=params, stream=True, timeout=None) as r:
            async for line in r.aiter_lines():
                if line.strip():
                    yield orjson.loads(line)

    async def close(self) -> None:
        if self.api._session is not None:
            await self.api._session.aclose()


async def open_transport(name: str, kubeconfig: Path) -> Transport:
    from trtfleet.kube import KubeApi, KubeSource

    if name == "handwritten":
        return Handwritten(kubeconfig)
    if name == "kubernetes_asyncio":
        return KubernetesAsyncio(await KubeApi.connect(KubeSource(kubeconfig=str(kubeconfig))))
    if name == "kubernetes_asyncio+trust_env":  # the session as the library builds it (trtfleet.kube turns it off)
        api = await KubeApi.connect(KubeSource(kubeconfig=str(kubeconfig)))
        rest = api._api.rest_client
        ours = rest.pool_manager
        rest.pool_manager = aiohttp.ClientSession(connector=ours.connector, trust_env=True, read_bufsize=2**21)
        ours.detach()
        return KubernetesAsyncio(api)
    if name == "lightkube":
        return Lightkube(kubeconfig)
    if name == "kr8s":
        import kr8s.asyncio

        return Kr8s(await kr8s.asyncio.api(kubeconfig=str(kubeconfig)))
    raise ValueError(f"unknown library {name!r}; known: {', '.join(LIBRARIES)}")


# ------------------------------------------------------------------------------------------ workload
@dataclass
class Phase:
    calls: int = 0
    cpu_s: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0


def adapter(name: str) -> Obj:
    return {
        "apiVersion": "trtfleet.io/v1alpha1",
        "kind": "Adapter",
        "metadata": {"name": name, "labels": {"bench": "kube-client"}},
        "spec": {"baseModel": "tiny", "source": {"uri": f"file:///adapters/{name}"}},
    }


def endpoint_slice(name: str, index: int) -> Obj:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "addressType": "IPv4",
        "metadata": {"name": name, "labels": {"trtfleet.io/basemodel": "tiny"}},
        "ports": [{"name": "grpc", "port": 8001, "protocol": "TCP"}],
        "endpoints": [
            {
                "addresses": [f"10.1.{index // 250}.{index % 250 + 1}"],
                "conditions": {"ready": True},
                "targetRef": {"kind": "Pod", "name": f"pod-{index}", "uid": f"uid-{index}"},
            }
        ],
    }


async def timed(phase: Phase, calls: Sequence[Callable[[], Awaitable[None]]], concurrency: int) -> None:
    gate = asyncio.Semaphore(concurrency)

    async def one(call: Callable[[], Awaitable[None]]) -> None:
        async with gate:
            started = time.perf_counter()
            await call()
            phase.latencies_s.append(time.perf_counter() - started)

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(one(c) for c in calls))
    phase.cpu_s += time.process_time() - cpu
    phase.wall_s += time.perf_counter() - wall
    phase.calls += len(calls)


def expect(status: int, want: int, what: str) -> None:
    if status != want:
        raise AssertionError(f"{what}: HTTP {status}, expected {want}")


async def run_library(name: str, kubeconfig: Path, ns: str, args: argparse.Namespace) -> dict[str, Phase]:
    t = await open_transport(name, kubeconfig)
    phases = {p: Phase() for p in ("apply", "list adapters", "list slices", "status patch", "watch", "cas")}
    ads, es = f"{GROUP}/namespaces/{ns}/adapters", f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"
    names = [f"a{i:03d}" for i in range(args.objects)]
    apply_params = {"fieldManager": "bench", "force": "true"}
    try:

        def apply_one(path: str, body: Obj) -> Callable[[], Awaitable[None]]:
            async def call() -> None:
                status, _ = await t.request("PATCH", path, apply_params, body, APPLY)
                expect(status, 200, f"apply {path}") if status != 201 else None

            return call

        calls = [apply_one(f"{ads}/{n}", adapter(n)) for n in names]
        calls += [apply_one(f"{es}/s{i:03d}", endpoint_slice(f"s{i:03d}", i)) for i in range(args.objects)]
        await timed(phases["apply"], calls, args.concurrency)

        def list_one(path: str) -> Callable[[], Awaitable[None]]:
            async def call() -> None:
                status, listing = await t.request("GET", path, None, None, "application/json")
                expect(status, 200, f"list {path}")
                assert len(listing["items"]) == args.objects, len(listing["items"])

            return call

        await timed(phases["list adapters"], [list_one(ads) for _ in range(args.lists)], 1)
        await timed(phases["list slices"], [list_one(es) for _ in range(args.lists)], 1)

        _, listing = await t.request("GET", ads, None, None, "application/json")
        seen: set[str] = set()
        done = asyncio.Event()

        async def follow() -> None:
            params = {"watch": "1", "resourceVersion": listing["metadata"]["resourceVersion"]}
            async for event in t.watch(ads, params):
                obj = event["object"]
                if event["type"] == "MODIFIED" and (obj.get("status") or {}).get("phase") == "Pending":
                    seen.add(obj["metadata"]["name"])
                    if len(seen) == args.objects:
                        done.set()
                        return

        watcher = asyncio.create_task(follow())

        def status_one(n: str) -> Callable[[], Awaitable[None]]:
            async def call() -> None:
                body = {"status": {"phase": "Pending", "observedGeneration": 1}}
                status, _ = await t.request("PATCH", f"{ads}/{n}/status", {"fieldManager": "bench"}, body, MERGE)
                expect(status, 200, "status patch")

            return call

        cpu, wall = time.process_time(), time.perf_counter()
        await timed(phases["status patch"], [status_one(n) for n in names], args.concurrency)
        await asyncio.wait_for(done.wait(), 120)
        w = phases["watch"]
        w.calls, w.cpu_s, w.wall_s = args.objects, time.process_time() - cpu, time.perf_counter() - wall
        w.latencies_s.append(w.wall_s)
        with contextlib.suppress(asyncio.CancelledError):
            watcher.cancel()
            await watcher

        def cas_one(n: str) -> Callable[[], Awaitable[None]]:
            async def call() -> None:
                status, obj = await t.request("GET", f"{ads}/{n}", None, None, "application/json")
                expect(status, 200, "get")
                rv = obj["metadata"]["resourceVersion"]
                body = {"metadata": {"resourceVersion": rv}, "status": {"taskId": 1}}
                status, _ = await t.request("PATCH", f"{ads}/{n}/status", None, body, MERGE)
                expect(status, 200, "cas")
                status, _ = await t.request("PATCH", f"{ads}/{n}/status", None, body, MERGE)
                expect(status, 409, "stale cas")

            return call

        await timed(phases["cas"], [cas_one(n) for n in names], args.concurrency)
        phases["cas"].calls *= 3
    finally:
        await t.close()
    return phases


def summarize(runs: Sequence[dict[str, Phase]]) -> dict[str, tuple[float, float, float]]:
    """Per phase: median over rounds of (CPU us per call, p50 ms, p95 ms)."""
    out: dict[str, tuple[float, float, float]] = {}
    for phase in runs[0]:
        cpu = statistics.median(r[phase].cpu_s / r[phase].calls * 1e6 for r in runs)
        p50 = statistics.median(statistics.median(r[phase].latencies_s) * 1e3 for r in runs)
        p95 = statistics.median(statistics.quantiles(r[phase].latencies_s, n=20)[-1] * 1e3
                                if len(r[phase].latencies_s) > 1 else r[phase].latencies_s[0] * 1e3 for r in runs)
        out[phase] = (cpu, p50, p95)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--objects", type=int, default=200)
    parser.add_argument("--lists", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--libraries", default=",".join(LIBRARIES))
    parser.add_argument("--json", type=Path, help="also write the raw per-round figures here")
    args = parser.parse_args(argv)
    libraries = [name.strip() for name in args.libraries.split(",") if name.strip()]
    runs: dict[str, list[dict[str, Phase]]] = {name: [] for name in libraries}
    with ControlPlane(controller_manager=False) as cp:
        cp.kubectl("apply", "--server-side", "-f", str(ROOT / "crds"))
        cp.wait_established("adapters.trtfleet.io")
        for round_ in range(args.rounds):
            order = libraries if round_ % 2 == 0 else libraries[::-1]
            for name in order:
                ns = f"bench-{name.replace('_', '-').replace('+', '-').lower()}-{round_}"
                cp.kubectl("create", "namespace", ns)
                runs[name].append(asyncio.run(run_library(name, cp.kubeconfig, ns, args)))
                cp.kubectl("delete", "namespace", ns, "--wait=false")
                print(f"# round {round_} {name} done", file=sys.stderr, flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    print(f"Machine: {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, Python "
          f"{platform.python_version()}. Commit: {commit.stdout.strip()}. {args.objects} objects, "
          f"concurrency {args.concurrency}, {args.lists} lists per kind, {args.rounds} rounds.\n")
    phases = list(next(iter(runs.values()))[0])
    summaries = {name: summarize(r) for name, r in runs.items()}
    print("| phase | " + " | ".join(libraries) + " |\n|---|" + "---|" * len(libraries))
    for phase in phases:
        for index, label in enumerate(("CPU us/call", "p50 ms", "p95 ms")):
            cells = " | ".join(f"{summaries[name][phase][index]:,.1f}" for name in libraries)
            print(f"| {phase} {label} | {cells} |")
    if args.json:
        raw = {n: [{p: vars(ph) for p, ph in r.items()} for r in rs] for n, rs in runs.items()}
        args.json.write_text(json.dumps(raw, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
