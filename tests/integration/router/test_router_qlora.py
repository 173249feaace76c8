"""A QLoRA adapter through the router: served only on its base variant's pods, where it answers as the QLoRA
model did in training; while the variant has no pod, 503 with Retry-After, never the plain base.

Real processes: a reference trtllm-serve worker for the plain BaseModel ``tiny``, a ``trtfleet worker --runtime
pytorch --base-quantization nf4:64:float32`` for the variant (bitsandbytes' round trip of every linear weight,
done when it starts, adapters by PEFT path as on the base), the router, and the official openai client. The
adapter is the tiny QLoRA adapter peft trained on the NF4 base (tests/fixtures/qlora, hack/gen_qlora_adapter.py);
its expected outputs are the QLoRA model's own (tests/unit/lora/test_qlora_served.py).
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import openai
import pytest
from trtfleet_engines.reference.server import free_port

from tests.integration.reference.serve_process import serving, trtfleet_worker
from tests.integration.router.test_router_merged import SHARED_ARGS, apply, served
from tests.unit.router.harness import LoopThread, RouterThread

pytestmark = pytest.mark.integration

ADAPTER = Path(__file__).resolve().parents[2] / "fixtures" / "qlora" / "upper-nf4"
EXPECTED: dict[str, Any] = json.loads((ADAPTER / "expected.json").read_text())
QUANTIZATION = "{quantType}:{blockSize}:{computeDtype}".format(**EXPECTED["baseQuantization"])
NAME = "tiny-upper-qlora"


def fleet(shared_url: str, variant_url: str | None) -> dict[str, Any]:
    """``tiny`` on the plain pod; the QLoRA adapter only on the variant (its pod when given)."""
    backends = [] if variant_url is None else [{"address": variant_url.removeprefix("http://"), "podId": "v-0"}]
    return {"baseModels": [{
        "name": "tiny", "runtime": "pytorch", "architecture": "reference", "maxInputLen": 128, "maxSeqLen": 256,
        "hostPages": 8, "devicePages": 4,
        "backends": [{"address": shared_url.removeprefix("http://"), "podId": "shared-0"}],
        "baseVariants": [{"name": "tiny-q-nf4", "backends": backends,
                          "adapters": [{"servedName": NAME, "taskId": 1, "artifact": str(ADAPTER), "pages": 1}]}],
    }]}


def test_the_qlora_adapter_is_served_on_its_variant_only(tmp_path: Path) -> None:
    assert EXPECTED["baseQuantization"]["doubleQuant"] is False  # the worker's spec below names no double quant
    port = free_port()
    with ExitStack() as stack:
        shared = stack.enter_context(serving(tmp_path, SHARED_ARGS))
        stack.enter_context(trtfleet_worker(
            tmp_path, ["--runtime", "pytorch", "--http-port", str(port), "--served-model-name", "tiny",
                       "--base-quantization", QUANTIZATION, "--max-loras", "1", "--max-cpu-loras", "3"],
            ready_path="/health", port=port))
        variant_url = f"http://127.0.0.1:{port}"
        loop = LoopThread()
        stack.callback(loop.close)
        router = RouterThread(loop, fleet(shared.url, variant_url))
        stack.callback(router.stop)
        client = openai.OpenAI(base_url=router.http_url + "/v1", api_key="unused", max_retries=0, timeout=60)

        for prompt, ids in zip(EXPECTED["prompts"], EXPECTED["output_ids"], strict=True):
            answer = client.completions.create(model=NAME, prompt=prompt, max_tokens=len(ids) + 1, temperature=0)
            assert answer.choices[0].text == bytes(ids).decode(), prompt  # the QLoRA model's greedy output
        assert (served(variant_url), served(shared.url)) == (len(EXPECTED["prompts"]), 0)
        cards = {m.id: m for m in client.models.list().data}
        assert NAME in cards and "tiny-q-nf4@variant" not in cards and "tiny" in cards

        apply(router, loop, fleet(shared.url, None))  # the variant scaled to zero: held back, not sent elsewhere
        with pytest.raises(openai.APIStatusError) as refused:
            client.completions.create(model=NAME, prompt="abc", max_tokens=4, temperature=0)
        assert refused.value.status_code == 503 and refused.value.response.headers.get("retry-after")
        assert served(shared.url) == 0
        assert client.completions.create(model="tiny", prompt="abc", max_tokens=4, temperature=0).choices


def test_the_triton_reference_variant_serves_it_by_task_id(tmp_path: Path) -> None:
    """The operator's reference Deployment: ``trtfleet worker --base-quantization`` (tritonserver), the adapter
    converted to TRT-LLM's tensors and pushed by task id, as on the base."""
    from trtfleet_engines.lora.convert import ConversionOptions, convert_dir
    from trtfleet_engines.reference.repository import build_reference_repository, default_reference_spec
    from trtfleet_engines.reference.server import start_worker

    from tests.integration.router.test_router_migration import _routes

    converted = tmp_path / "converted"
    convert_dir(ADAPTER, converted, ConversionOptions())
    http, grpc, metrics = free_port(), free_port(), free_port()
    with ExitStack() as stack:
        plain = start_worker(build_reference_repository(tmp_path / "plain-repo"))
        stack.callback(plain.stop)
        stack.enter_context(trtfleet_worker(
            tmp_path, ["--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics),
                       "--base-quantization", QUANTIZATION], ready_path="/v2/health/ready", port=http))
        loop = LoopThread()
        stack.callback(loop.close)
        spec = default_reference_spec().model_dump(mode="json", by_alias=True, exclude_none=True)
        router = RouterThread(loop, {"baseModels": [{
            "name": "tiny", "spec": spec,
            "backends": [{"address": plain.grpc_url, "http": f"{plain.host}:{plain.http_port}", "podId": "plain-0"}],
            "baseVariants": [{
                "name": "tiny-q-nf4",
                "backends": [{"address": f"127.0.0.1:{grpc}", "http": f"127.0.0.1:{http}", "podId": "v-0"}],
                "adapters": [{"servedName": NAME, "taskId": 1, "artifact": str(converted), "pages": 1}],
            }],
        }]})
        stack.callback(router.stop)
        client = openai.OpenAI(base_url=router.http_url + "/v1", api_key="unused", max_retries=0, timeout=60)
        for prompt, ids in zip(EXPECTED["prompts"], EXPECTED["output_ids"], strict=True):
            answer = client.completions.create(model=NAME, prompt=prompt, max_tokens=len(ids) + 1, temperature=0)
            assert answer.choices[0].text == bytes(ids).decode(), prompt
        assert _routes(router, "tiny-q-nf4@variant") == len(EXPECTED["prompts"]) and _routes(router, "tiny") == 0
