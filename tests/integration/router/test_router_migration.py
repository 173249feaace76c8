"""Migrating a base model from ``tensorrtllm`` (Triton) to ``pytorch`` (trtllm-serve) under traffic, no request lost.

Real processes: one reference ``tritonserver`` worker serving the old BaseModel ``tiny`` (the sample adapter
``upper`` converted to TRT-LLM's format), one reference trtllm-serve worker for the new BaseModel ``tiny-torch``
(``serving.replaces: tiny``, the same adapter as its PEFT directory), the router between them and two threads of
the official openai client asking for ``tiny`` and ``tiny-upper`` the whole time. The fleet changes as a Kubernetes
migration would be seen by discovery (the same ``Router.apply`` the watch calls): the new BaseModel appears without
a ready pod, gets one, then the old BaseModel is deleted and its pod stopped. Every answer must be the expected one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import openai
import pytest
from trtfleet_engines.reference.numpy_llama import SAMPLE_ADAPTERS_DIR
from trtfleet_router.discovery.static import FleetConfig, snapshot_from_config

from tests.integration.reference.serve_process import serving
from tests.integration.reference.triton_client import wait_until
from tests.integration.router.support import CACHE_ADAPTERS_PER_WORKER, reference_workers
from tests.support.lora_outputs import FIXTURE
from tests.unit.router.harness import LoopThread, RouterThread

pytestmark = pytest.mark.integration

PROMPT: str = FIXTURE["prompts"][0]
WANT = {"tiny": FIXTURE["models"]["base"]["outputs"][0], "tiny-upper": FIXTURE["models"]["upper"]["outputs"][0]}
MAX_TOKENS = 64
SERVE_ARGS = ["--served_model_name", "tiny-torch", "--max-loras", "1", "--max-cpu-loras", "2", "--max-lora-rank", "8"]


def _old_base(worker: Any, converted: Path) -> dict[str, Any]:
    from trtfleet_engines.reference.repository import default_reference_spec

    spec = default_reference_spec().model_dump(mode="json", by_alias=True, exclude_none=True)
    return {
        "name": "tiny",
        "spec": spec,
        "hostPages": CACHE_ADAPTERS_PER_WORKER,
        "devicePages": CACHE_ADAPTERS_PER_WORKER,
        "backends": [{"address": worker.grpc_url, "http": f"{worker.host}:{worker.http_port}", "podId": "old-0"}],
        "adapters": [{"servedName": "tiny-upper", "taskId": 1, "artifact": str(converted), "pages": 1}],
    }


def _new_base(serve_url: str | None) -> dict[str, Any]:
    backends = [] if serve_url is None else [{"address": serve_url.removeprefix("http://"), "podId": "new-0"}]
    return {
        "name": "tiny-torch",
        "runtime": "pytorch",
        "architecture": "reference",
        "replaces": "tiny",
        "maxInputLen": 128,
        "maxSeqLen": 256,
        "hostPages": 8,
        "devicePages": 4,
        "backends": backends,
        "adapters": [
            {"servedName": "tiny-upper", "taskId": 7, "artifact": str(SAMPLE_ADAPTERS_DIR / "upper"), "pages": 1}
        ],
    }


class Traffic:
    """Client threads asking for ``tiny`` and ``tiny-upper`` until stopped; every answer checked."""

    def __init__(self, router: RouterThread, threads: int = 2) -> None:
        self.client = openai.OpenAI(base_url=router.http_url + "/v1", api_key="unused", max_retries=0, timeout=60)
        self.answered = 0
        self.failures: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]
        for thread in self._threads:
            thread.start()

    def _run(self, index: int) -> None:
        models = ("tiny", "tiny-upper")
        turn = index
        while not self._stop.is_set():
            model = models[turn % 2]
            turn += 1
            try:
                completion = self.client.completions.create(
                    model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0
                )
                got = completion.choices[0].text
                problem = None if got == WANT[model] and completion.model == model else f"{model}: {got!r}"
            except openai.OpenAIError as exc:
                problem = f"{model}: {exc!r}"
            with self._lock:
                self.answered += 1
                if problem is not None:
                    self.failures.append(problem)

    def answered_at_least(self, count: int) -> Callable[[], bool]:
        return lambda: self.answered >= count

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=120)
            assert not thread.is_alive(), "a client thread did not finish"


def _routes(router: RouterThread, base: str) -> int:
    async def count() -> int:
        fleet = router.router.fleets.fleets.get(base)
        if fleet is None:
            return 0
        snapshot = fleet.snapshot()
        return snapshot.warm_routes_total + snapshot.cold_loads_total

    return router.loop.run(count())


@pytest.fixture()
def converted_upper(tmp_path: Path) -> Path:
    from trtfleet_engines.lora.convert import ConversionOptions, convert_dir

    out = tmp_path / "upper"
    convert_dir(SAMPLE_ADAPTERS_DIR / "upper", out, ConversionOptions())
    return out


def test_tensorrtllm_to_pytorch_migration_loses_no_request(tmp_path: Path, converted_upper: Path) -> None:
    with ExitStack() as stack:
        old_workers = stack.enter_context(reference_workers(count=1))
        new_worker = stack.enter_context(serving(tmp_path, SERVE_ARGS))
        loop = LoopThread()
        stack.callback(loop.close)
        old = _old_base(old_workers[0], converted_upper)
        router = RouterThread(loop, {"baseModels": [old]})
        stack.callback(router.stop)

        def apply(*bases: dict[str, Any]) -> None:
            snapshot = snapshot_from_config(FleetConfig.model_validate({"baseModels": list(bases)}))

            async def swap() -> None:
                router.router.apply(snapshot)

            loop.run(swap())

        traffic = Traffic(router)
        stack.callback(traffic.stop)
        wait_until(traffic.answered_at_least(6), timeout_s=120)

        apply(old, _new_base(None))  # the new BaseModel exists, its pod is not ready: the old one answers
        moved_from = traffic.answered
        wait_until(traffic.answered_at_least(moved_from + 6), timeout_s=120)
        assert _routes(router, "tiny-torch") == 0

        apply(old, _new_base(new_worker.url))  # its pod is ready: the names move to it
        old_routes = _routes(router, "tiny")
        wait_until(lambda: _routes(router, "tiny-torch") >= 3, timeout_s=120)
        wait_until(traffic.answered_at_least(traffic.answered + 6), timeout_s=120)

        apply(_new_base(new_worker.url))  # the old BaseModel deleted, its pod stopped while clients keep asking
        old_workers[0].stop()
        stopped_at = traffic.answered
        wait_until(traffic.answered_at_least(stopped_at + 6), timeout_s=120)
        traffic.stop()

        assert traffic.failures == [], traffic.failures[:5]
        assert _routes(router, "tiny") == 0  # the old fleet is gone from the router
        assert old_routes >= 3  # before the move, the old pod took the adapter's requests
        models = [m.id for m in traffic.client.models.list().data]
        assert "tiny" in models and "tiny-upper" in models  # the old name stays an alias of the new BaseModel


def test_an_unready_successor_hands_requests_back(tmp_path: Path, converted_upper: Path) -> None:
    """The new pods going away mid-migration sends the names back to the old BaseModel (nothing refused)."""
    with ExitStack() as stack:
        old_workers = stack.enter_context(reference_workers(count=1))
        new_worker = stack.enter_context(serving(tmp_path, SERVE_ARGS))
        loop = LoopThread()
        stack.callback(loop.close)
        old = _old_base(old_workers[0], converted_upper)
        router = RouterThread(loop, {"baseModels": [old, _new_base(new_worker.url)]})
        stack.callback(router.stop)
        client = openai.OpenAI(base_url=router.http_url + "/v1", api_key="unused", max_retries=0, timeout=60)

        def ask(model: str) -> str:
            completion = client.completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0)
            return completion.choices[0].text

        assert ask("tiny-upper") == WANT["tiny-upper"]
        assert _routes(router, "tiny-torch") == 1 and _routes(router, "tiny") == 0
        snapshot = snapshot_from_config(FleetConfig.model_validate({"baseModels": [old, _new_base(None)]}))

        async def swap() -> None:
            router.router.apply(snapshot)

        loop.run(swap())
        assert ask("tiny-upper") == WANT["tiny-upper"]
        assert ask("tiny") == WANT["tiny"]
        assert _routes(router, "tiny") >= 1
