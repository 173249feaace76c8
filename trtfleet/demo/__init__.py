"""``trtfleet demo``: reference workers + the router on this machine, no GPU, no cluster.

    trtfleet demo [--workers 2] [--adapters upper,reverse,json] [--http-port 8080] [--grpc-port 8081]
                  [--metrics-port 9090] [--host 127.0.0.1] [--once] [--prompt TEXT] [--workdir DIR]
                  [--runtime pytorch|tensorrtllm] [--autoscale N] [--gateway [--gateway-port 8000]]

Steps, each a subprocess of the ``trtfleet`` CLI (this package imports no component):

1. ``trtfleet lora convert`` the sample PEFT adapters (``upper``, ``reverse``, ``json``) to TRT-LLM's
   ``lora_weights`` / ``lora_config`` format;
2. ``trtfleet worker`` x N: the real tritonserver running the tiny reference Llama, each with a LoRA
   cache that holds fewer adapters than the demo serves (see :mod:`trtfleet.demo.fleet`);
3. ``trtfleet router --fleet-config``: the adapter-aware router over those workers, with the adapters
   registered under task ids 1, 2, 3;
4. instructions (curl, the ``openai`` client), then a live summary every ``--refresh-s`` seconds, until
   Ctrl-C / SIGTERM; ``--once`` instead sends one request per adapter, prints the answers and stops.

Everything the demo writes lives in a temporary directory (or ``--workdir``, kept) and every child is
stopped on exit. Exit codes: 0 success or a clean stop, 1 a step failed (the log tail is printed), 2 bad
arguments or missing reference assets.

``--gateway`` (``make demo-gateway``) puts a real Envoy in front, configured as a Gateway API inference gateway
(``ext_proc`` + ``ORIGINAL_DST``, :mod:`trtfleet.demo.envoy`), with the router as its endpoint picker
(``--epp-port``): clients call Envoy on ``--gateway-port``, the picker chooses each request's worker and rewrites
its body, Envoy carries it there (docs/gateway.md). ``make tools`` installs the pinned Envoy.

``--autoscale N`` replaces the live summary by an autoscaler: workers start and stop (0..N) with the
operator's own decision function (:mod:`trtfleet.demo.autoscale`).

That is ``--runtime tensorrtllm``. The default, ``--runtime pytorch``, runs reference trtllm-serve workers
instead (no conversion, OpenAI API only; see :mod:`trtfleet.demo.pytorch`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, Final

import yaml

from trtfleet.api import BaseModelSpec
from trtfleet.demo import pytorch, triton
from trtfleet.demo.autoscale import (
    TARGET_REQUESTS_PER_WORKER,
    TICK_S,
    ZERO_AFTER_S,
    DemoAutoscaler,
    WorkerPool,
    demo_spec,
    router_drained,
    write_routing_file,
)
from trtfleet.demo.batch import batch_example
from trtfleet.demo.envoy import envoy_binary, envoy_command, gateway_bootstrap, write_bootstrap
from trtfleet.demo.errors import DemoError, DemoInterrupted, RequestError, StartupError
from trtfleet.demo.fleet import (
    ADAPTERS_PER_WORKER_DEFAULT,
    BASE_MODEL,
    SAMPLE_ADAPTERS,
    ConvertedAdapter,
    WorkerEndpoint,
    build_basemodel,
    plan_spec,
)
from trtfleet.demo.processes import (
    Child,
    Supervisor,
    check_ports_free,
    free_port,
    http_ok,
    log_tails,
    trtfleet_command,
)
from trtfleet.demo.summary import fetch_summary, format_summary

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
CONVERT_TIMEOUT_S: Final = 120.0
WORKER_READY_TIMEOUT_S: Final = 300.0
ROUTER_READY_TIMEOUT_S: Final = 60.0
ENVOY_READY_TIMEOUT_S: Final = 30.0
SUMMARY_SETTLE_S: Final = 10.0
REQUEST_TIMEOUT_S: Final = 60.0
STOP_TIMEOUT_S: Final = 15.0
ROUTER_DRAIN_TIMEOUT_S: Final = 2.0
MAX_TOKENS: Final = 48
DEFAULT_PROMPT: Final = "hello world"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, default=2, help="reference workers to start (default 2)")
    parser.add_argument("--adapters", default=",".join(SAMPLE_ADAPTERS),
                        help=f"sample adapters to serve, comma-separated (default {','.join(SAMPLE_ADAPTERS)})")
    parser.add_argument("--adapters-per-worker", type=int, default=ADAPTERS_PER_WORKER_DEFAULT,
                        help="adapters each worker's LoRA host cache holds (default 2)")
    parser.add_argument("--host", default="127.0.0.1", help="address the router listens on (default 127.0.0.1)")
    parser.add_argument("--http-port", type=int, default=8080, help="router OpenAI + Triton HTTP port")
    parser.add_argument("--grpc-port", type=int, default=8081, help="router Triton gRPC port")
    parser.add_argument("--metrics-port", type=int, default=9090, help="router /metrics port")
    parser.add_argument("--policy", default="ttft-cost", help="routing policy (default ttft-cost)")
    parser.add_argument("--once", action="store_true",
                        help="start, send one request per adapter, print the answers, stop")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help="prompt of the --once requests")
    parser.add_argument("--refresh-s", type=float, default=3.0, help="seconds between summary refreshes")
    parser.add_argument("--workdir", type=Path, help="keep converted adapters, configs and logs here")
    parser.add_argument("--runtime", choices=("tensorrtllm", "pytorch"), default="pytorch",
                        help="pytorch: reference trtllm-serve workers (default, what a new BaseModel gets); "
                        "tensorrtllm: reference tritonserver workers (the engine flow's Triton contract)")
    parser.add_argument("--autoscale", type=int, default=0, metavar="N",
                        help="start and stop workers (0 to N) by demand, with the operator's decision function; "
                        "the router holds requests while none is ready (default 0: off)")
    parser.add_argument("--autoscale-zero-after-s", type=int, default=ZERO_AFTER_S,
                        help=f"with --autoscale: idle seconds before 0 workers (default {ZERO_AFTER_S})")
    parser.add_argument("--gateway", action="store_true",
                        help="serve clients through Envoy with the router as its endpoint picker (docs/gateway.md)")
    parser.add_argument("--gateway-port", type=int, default=8000, help="Envoy's port with --gateway (default 8000)")
    parser.add_argument("--epp-port", type=int, default=9002,
                        help="the router's endpoint-picker (ext_proc) port with --gateway (default 9002)")
    parser.add_argument("--max-loras", type=int, default=pytorch.MAX_LORAS_DEFAULT,
                        help="pytorch: adapters each worker's device tier holds (default 1)")
    parser.set_defaults(func=run)


def say(text: str = "") -> None:
    print(text, flush=True)


def reference_assets() -> Path:
    """The reference engine's assets (tiny model, sample adapters), found without importing the engine."""
    spec = importlib.util.find_spec("trtfleet_engines")
    if spec is None or not spec.submodule_search_locations:
        raise StartupError("the reference engine is not installed: pip install 'trtfleet[reference]'")
    assets = Path(next(iter(spec.submodule_search_locations))) / "reference" / "assets"
    if not (assets / "tiny-llama" / "config.json").is_file():
        raise StartupError(f"no tiny model in {assets}: regenerate it with hack/gen_reference_assets.py")
    return assets


@contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[None]:
    def handler(signum: int, _frame: FrameType | None) -> None:
        if not stop.is_set():
            say(f"\n{signal.Signals(signum).name}: stopping the demo")
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def convert_adapters(sup: Supervisor, assets: Path, names: list[str], out: Path) -> list[ConvertedAdapter]:
    say(f"converting {len(names)} sample adapters (PEFT -> TRT-LLM float16) ...")
    started = time.monotonic()
    children = [
        sup.spawn(f"convert-{name}", [*trtfleet_command(), "lora", "convert", str(assets / "adapters" / name),
                                      str(out / name), "--dtype", "float16", "--engine-dtype", "float16",
                                      "--base-config", str(assets / "tiny-llama" / "config.json")])
        for name in names
    ]
    sup.wait_exit(children, what="converting the adapters", timeout_s=CONVERT_TIMEOUT_S)
    adapters = [ConvertedAdapter.from_manifest(n, out / n, json.loads((out / n / "manifest.json").read_text()))
                for n in names]
    for a in adapters:
        say(f"  {a.served_name}: rank {a.rank}, {len(a.modules)} modules, {a.weights_bytes} bytes, task id {a.task_id}")
    say(f"  done in {time.monotonic() - started:.1f} s")
    return adapters


def start_fleet(
    sup: Supervisor, args: argparse.Namespace, adapters: list[ConvertedAdapter], assets: Path, workdir: Path
) -> tuple[list[tuple[WorkerEndpoint, Child]], Child]:
    model_config = json.loads((assets / "tiny-llama" / "config.json").read_text())
    spec, cache = plan_spec(model_config, adapters, args.adapters_per_worker)
    basemodel = workdir / "basemodel.yaml"
    basemodel.write_text(yaml.safe_dump(build_basemodel(spec), sort_keys=False))
    say(f"LoRA host cache per worker: {cache.host_bytes} bytes = {cache.host_pages} pages "
        f"({args.adapters_per_worker} adapters of {cache.pages_per_adapter} pages; the demo serves {len(adapters)})")
    started = [triton.spawn_worker(sup, basemodel, assets, i + 1, say) for i in range(args.workers)]
    fleet = workdir / "fleet.yaml"
    triton.write_fleet(fleet, spec, [w for w, _ in started], adapters)
    # The router starts once the workers answer: started beside them, it probes them while they still refuse
    # connections, its gRPC channels back off, and the first requests after "ready" fail fast for up to the
    # backoff (a 503 when the other worker is down).
    wait_workers(sup, args, started, [c for _, c in started])
    return started, start_router(sup, args, fleet)


def start_router(sup: Supervisor, args: argparse.Namespace, fleet: Path) -> Child:
    router = sup.spawn("router", [
        *trtfleet_command(), "router", "--fleet-config", str(fleet), "--host", args.host,
        "--http-port", str(args.http_port), "--grpc-port", str(args.grpc_port),
        "--metrics-port", str(args.metrics_port), "--policy", args.policy,
        "--drain-timeout-s", str(ROUTER_DRAIN_TIMEOUT_S),
        *(["--policy-config", str(write_routing_file(fleet.parent / "routing.yaml"))] if args.autoscale else []),
        "--peer-port", "-1",  # one router: no replicas to share its view with, no fixed port to collide on
        "--debug-endpoints",  # the live summary reads /debug/fleets (no token file: loopback clients only)
        "--batch-store", str(fleet.parent / "batches"),
        *(["--epp-port", str(args.epp_port)] if args.gateway else []),
    ])
    say(f"starting the router on {args.host}: http {args.http_port}, grpc {args.grpc_port}, "
        f"metrics {args.metrics_port} (fleet file {fleet})")
    return router


def start_gateway(sup: Supervisor, args: argparse.Namespace, workdir: Path) -> Child:
    """Envoy on ``--gateway-port``, its ``ext_proc`` filter calling the router's picker port."""
    bootstrap = gateway_bootstrap(args.gateway_port, free_port(), picker=f"127.0.0.1:{args.epp_port}", host=args.host)
    config = write_bootstrap(bootstrap, workdir / "envoy.yaml")
    envoy = sup.spawn("envoy", envoy_command(config))
    admin = bootstrap["admin"]["address"]["socket_address"]["port_value"]
    sup.wait_until(lambda: http_ok(f"http://127.0.0.1:{admin}/ready"), what="starting Envoy",
                   timeout_s=ENVOY_READY_TIMEOUT_S, watch=[envoy], progress=say)
    say(f"Envoy on {args.host}:{args.gateway_port}, its endpoint picker the router's port {args.epp_port} "
        f"(config {config})")
    return envoy


def local_url(host: str, port: int) -> str:
    return f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}"


def client_url(args: argparse.Namespace) -> str:
    """Where clients call: Envoy with ``--gateway``, else the router."""
    return local_url(args.host, args.gateway_port if args.gateway else args.http_port)


def health_url(args: argparse.Namespace, w: WorkerEndpoint) -> str:
    path = pytorch.HEALTH_PATH if args.runtime == "pytorch" else "/v2/health/ready"
    return f"http://{w.host}:{w.http_port}{path}"


def wait_workers(sup: Supervisor, args: argparse.Namespace, workers: list[tuple[WorkerEndpoint, Child]],
                 watch: list[Child]) -> None:
    pending = dict(workers)

    def workers_ready() -> bool:
        for w in [w for w in pending if http_ok(health_url(args, w))]:
            say(f"  {w.name} ready")
            del pending[w]
        return not pending

    took = sup.wait_until(workers_ready, what="loading the model into the workers",
                          timeout_s=WORKER_READY_TIMEOUT_S, watch=watch, progress=say)
    say(f"workers ready in {took:.1f} s")


def wait_ready(sup: Supervisor, args: argparse.Namespace, workers: list[tuple[WorkerEndpoint, Child]],
               router: Child, served: list[str]) -> None:
    children = [c for _, c in workers]  # ready before the router started (start_fleet, the pytorch branch)
    base = local_url(args.host, args.http_port)

    debug = local_url(args.host, args.metrics_port) + "/debug/fleets"

    def router_ready() -> bool:
        if not http_ok(f"{base}/v2/health/ready"):
            return False
        try:
            with urllib.request.urlopen(f"{base}/v1/models", timeout=5) as resp:
                listed = {m["id"] for m in json.loads(resp.read())["data"]}
            # every worker routable: the router's health probes may have ejected one that was still starting
            # (connection refused), and it takes it back only once its ejection time is over
            with urllib.request.urlopen(debug, timeout=5) as resp:
                pods = json.loads(resp.read()).get(BASE_MODEL, {}).get("pods", [])
        except (OSError, ValueError, KeyError):
            return False
        return set(served) <= listed and sum(1 for pod in pods if pod["ready"]) >= len(workers)

    sup.wait_until(router_ready, what="waiting for the router to list the adapters and route to every worker",
                   timeout_s=ROUTER_READY_TIMEOUT_S, watch=[*children, router], progress=say)


def print_instructions(args: argparse.Namespace, served: list[str]) -> None:
    router = local_url(args.host, args.http_port)
    base = client_url(args)
    if args.gateway and args.runtime != "pytorch":
        print_gateway_generate(args, served)
        return
    through = " through Envoy (the router picks each request's worker)" if args.gateway else ""
    say(f"\nOpenAI API at {base}/v1{through} (models: {BASE_MODEL} = the base model, {', '.join(served)})")
    for name in served:
        body = json.dumps({"model": name, "prompt": args.prompt, "max_tokens": MAX_TOKENS, "temperature": 0})
        say(f"  curl -s {base}/v1/completions -H 'content-type: application/json' -d '{body}'")
    say("\n  from openai import OpenAI")
    say(f'  client = OpenAI(base_url="{base}/v1", api_key="unused")')
    for name in served:
        say(f'  client.chat.completions.create(model="{name}", messages=[{{"role": "user", '
            f'"content": {json.dumps(args.prompt)}}}]).choices[0].message.content')
    say("\nBatches (OpenAI Files + Batches API, the router's own; it keeps them in the work directory's batches/):")
    for line in batch_example(router, [BASE_MODEL, *served], args.prompt, MAX_TOKENS):
        say(line)
    if args.runtime == "pytorch":
        say("\nTriton endpoints: none for this runtime (trtllm-serve pods speak the OpenAI API only)")
    else:
        say(f"\nTriton: HTTP {router}/v2, gRPC {args.host}:{args.grpc_port} (model tensorrt_llm_bls)")
    say(f"Metrics: {local_url(args.host, args.metrics_port)}/metrics "
        f"(routing state: {local_url(args.host, args.metrics_port)}/debug/fleets)\n")


def print_gateway_generate(args: argparse.Namespace, served: list[str]) -> None:
    """Through a gateway, Triton pods take Triton's generate extension (the OpenAI API is the router's own)."""
    base = client_url(args)
    say(f"\nTriton generate through Envoy at {base}/v2/models/<model>/generate "
        f"(models: {BASE_MODEL} = the base model, {', '.join(served)}; the picker adds each adapter's lora_task_id)")
    for name in served:
        body = json.dumps({"text_input": args.prompt, "max_tokens": MAX_TOKENS})
        say(f"  curl -s {base}/v2/models/{name}/generate -H 'content-type: application/json' -d '{body}'")
    say(f"\nThe router's own front ends stay up beside it: OpenAI API {local_url(args.host, args.http_port)}/v1")
    say(f"Metrics: {local_url(args.host, args.metrics_port)}/metrics\n")


def complete(args: argparse.Namespace, model: str) -> str:
    """One answer from ``model``: an OpenAI completion, or Triton's generate through a gateway to Triton pods."""
    generate = args.gateway and args.runtime != "pytorch"
    if generate:
        url = f"{client_url(args)}/v2/models/{model}/generate"
        body = json.dumps({"text_input": args.prompt, "max_tokens": MAX_TOKENS})
    else:
        url = f"{client_url(args)}/v1/completions"
        body = json.dumps({"model": model, "prompt": args.prompt, "max_tokens": MAX_TOKENS, "temperature": 0})
    request = urllib.request.Request(url, data=body.encode(), headers={"content-type": "application/json"},
                                     method="POST")
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as resp:
            answer: dict[str, Any] = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise RequestError(f"{model}: HTTP {exc.code}: {exc.read().decode(errors='replace')[:500]}") from exc
    except (OSError, ValueError) as exc:
        raise RequestError(f"{model}: {exc}") from exc
    return str(answer["text_output"] if generate else answer["choices"][0]["text"])


def run_once(args: argparse.Namespace, served: list[str], names: dict[int, str], workers: int) -> None:
    say(f"one request per model, prompt {json.dumps(args.prompt)}:")
    for model in [BASE_MODEL, *served]:
        say(f"  {model:<14} -> {json.dumps(complete(args, model))}")
    metrics = local_url(args.host, args.metrics_port)
    models = 1 + len(served)
    # a gateway's picker counts a request when Envoy ends its stream, a moment after the client has the answer
    summary = fetch_summary(metrics, names, workers, workers)
    until = time.monotonic() + SUMMARY_SETTLE_S
    while summary.requests_ok + summary.requests_failed < models and time.monotonic() < until:
        time.sleep(0.1)
        summary = fetch_summary(metrics, names, workers, workers)
    say(format_summary(summary))


def run_live(sup: Supervisor, args: argparse.Namespace, workers: list[tuple[WorkerEndpoint, Child]],
             router: Child, names: dict[int, str]) -> None:
    say(f"live summary every {args.refresh_s:g} s; Ctrl-C stops everything")
    last = ""
    while not sup.stop_requested.is_set():
        sup.check_alive([router, *(c for _, c in workers)])
        ready = sum(http_ok(health_url(args, w)) for w, _ in workers)
        try:
            text = format_summary(fetch_summary(local_url(args.host, args.metrics_port), names, ready, len(workers)))
        except (OSError, ValueError) as exc:
            text = f"router metrics unavailable: {exc}"
        if text != last:
            say(f"[{time.strftime('%H:%M:%S')}] {text}")
            last = text
        sup.stop_requested.wait(args.refresh_s)


def run_autoscaled(sup: Supervisor, args: argparse.Namespace, workers: list[tuple[WorkerEndpoint, Child]],
                   router: Child, adapters: list[ConvertedAdapter], assets: Path, workdir: Path) -> None:
    """Workers from ``len(workers)`` to 0..``--autoscale`` by demand (see :mod:`trtfleet.demo.autoscale`)."""
    metrics_url = f"{local_url(args.host, args.metrics_port)}/metrics"
    if args.runtime == "pytorch":
        def spawn(index: int) -> tuple[WorkerEndpoint, Child]:
            return pytorch.spawn_worker(sup, args, assets, index)

        def write(ws: list[WorkerEndpoint]) -> None:
            pytorch.rewrite_fleet(workdir, ws, adapters)
    else:
        base = BaseModelSpec.model_validate(yaml.safe_load((workdir / "basemodel.yaml").read_text())["spec"])

        def spawn(index: int) -> tuple[WorkerEndpoint, Child]:
            return triton.spawn_worker(sup, workdir / "basemodel.yaml", assets, index, say)

        def write(ws: list[WorkerEndpoint]) -> None:
            triton.write_fleet(workdir / "fleet.yaml", base, ws, adapters)

    pool = WorkerPool(spawn, lambda w: http_ok(health_url(args, w)), write,
                      lambda w: router_drained(metrics_url, w), serving=list(workers), next_index=len(workers) + 1)
    spec = demo_spec(args.autoscale, args.autoscale_zero_after_s)
    scaler = DemoAutoscaler(spec, pool, metrics_url, say)
    say(f"autoscaling 0..{args.autoscale} workers ({TARGET_REQUESTS_PER_WORKER:g} requests each; down after "
        f"{spec.scale_down_stabilization_seconds} s, to zero after {spec.scale_to_zero_after_seconds} s idle); "
        "Ctrl-C stops everything")
    while not sup.stop_requested.is_set():
        sup.check_alive([router, *pool.children()])
        scaler.tick()
        sup.stop_requested.wait(TICK_S)


def parse_adapters(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in SAMPLE_ADAPTERS]
    if unknown or not names or len(set(names)) != len(names):
        raise ValueError(f"--adapters: pick distinct names from {', '.join(SAMPLE_ADAPTERS)} (got {text!r})")
    return names


def run(args: argparse.Namespace) -> int:
    try:
        names = parse_adapters(args.adapters)
        if args.workers < 1 or args.adapters_per_worker < 1 or args.max_loras < 1:
            raise ValueError("--workers, --adapters-per-worker and --max-loras must be at least 1")
        if args.autoscale < 0 or (args.autoscale and (args.once or args.workers > args.autoscale)):
            raise ValueError("--autoscale N: N >= --workers (the workers it starts with), and not with --once")
        assets = reference_assets()
        ports = {"--http-port": args.http_port, "--grpc-port": args.grpc_port, "--metrics-port": args.metrics_port}
        if args.gateway:
            if args.autoscale:
                raise ValueError("--gateway and --autoscale: pick one")
            envoy_binary()  # installed? (make tools)
            ports.update({"--gateway-port": args.gateway_port})
            check_ports_free("127.0.0.1", {"--epp-port": args.epp_port})
        check_ports_free(args.host, ports)
    except (ValueError, DemoError) as exc:
        print(f"trtfleet demo: {exc}", file=sys.stderr)
        return EXIT_USAGE
    own_workdir = args.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="trtfleet-demo-")) if own_workdir else args.workdir.resolve()
    (workdir / "logs").mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    sup = Supervisor(workdir / "logs", stop, notice=say, stop_timeout_s=STOP_TIMEOUT_S)
    started = time.monotonic()
    with stop_on_signals(stop):  # also while stopping: a second Ctrl-C must not cut the cleanup short
        try:
            if args.runtime == "pytorch":
                adapters = pytorch.peft_adapters(assets, names)
                workers = pytorch.start_workers(sup, args, assets)
                say(f"starting {len(workers)} reference trtllm-serve workers (device tier {args.max_loras}, "
                    f"host tier {args.adapters_per_worker} adapters)")
                wait_workers(sup, args, workers, [c for _, c in workers])
                fleet, note = pytorch.write_fleet(workdir, [w for w, _ in workers], adapters)
                say(note)
                router = start_router(sup, args, fleet)
            else:
                adapters = convert_adapters(sup, assets, names, workdir / "adapters")
                workers, router = start_fleet(sup, args, adapters, assets, workdir)
            served = [a.served_name for a in adapters]
            wait_ready(sup, args, workers, router, served)
            if args.gateway:
                start_gateway(sup, args, workdir)
            say(f"trtfleet demo ready in {time.monotonic() - started:.1f} s "
                f"({args.workers} workers, {len(served)} adapters; logs in {workdir / 'logs'})")
            print_instructions(args, served)
            task_names = {a.task_id: a.served_name for a in adapters}
            if args.once:
                run_once(args, served, task_names, len(workers))
            elif args.autoscale:
                run_autoscaled(sup, args, workers, router, adapters, assets, workdir)
            else:
                run_live(sup, args, workers, router, task_names)
            return EXIT_OK
        except DemoInterrupted:
            return EXIT_OK
        except DemoError as exc:
            print(f"trtfleet demo: {exc}", file=sys.stderr)
            if isinstance(exc, StartupError) and exc.log_tail:
                print(exc.log_tail, file=sys.stderr)
            elif isinstance(exc, RequestError):  # what the router and the workers said about it
                print(log_tails(sup.children), file=sys.stderr)
            return EXIT_FAILED
        finally:
            say("stopping the router and the workers ...")
            sup.stop_all(STOP_TIMEOUT_S)
            if own_workdir:
                shutil.rmtree(workdir, ignore_errors=True)
            say("stopped")
