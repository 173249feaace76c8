"""The tiny model's sample adapters behind the router on a ``pytorch`` fleet, shared by the trtllm-serve and the
Triton-llmapi tests: the expected greedy outputs, the fleet entry, a router on an ExitStack, and the checks both
fleets must pass through the official openai client."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any

import httpx
import openai
from trtfleet_engines.reference.numpy_llama import SAMPLE_ADAPTERS_DIR

from tests.support.lora_outputs import OUTPUTS, PROMPTS, SAMPLE_ADAPTERS
from tests.unit.router.harness import LoopThread, RouterThread

ADAPTERS = SAMPLE_ADAPTERS
TASK_IDS = {"upper": 11, "reverse": 12, "json": 13}
MAX_TOKENS = 64


def served_name(name: str) -> str:
    """The served model name of ``base`` or of one sample adapter."""
    return "tiny" if name == "base" else f"tiny-{name}"


def pytorch_fleet_config(backends: list[dict[str, str]], cache: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """One ``pytorch`` BaseModel ``tiny`` with the three sample adapters; ``cache`` is a worker's tier snapshot
    (pages and adapters per tier), ``fields`` more BaseModel fields (``server``, say)."""
    adapter_pages = cache["devicePages"] // cache["deviceAdapters"]  # the sample adapters are of the max rank
    return {"baseModels": [{
        "name": "tiny", "runtime": "pytorch", **fields, "architecture": "reference",
        "maxInputLen": 128, "maxSeqLen": 256, "hostPages": cache["hostPages"], "devicePages": cache["devicePages"],
        "backends": backends,
        "adapters": [{"servedName": served_name(n), "taskId": TASK_IDS[n], "artifact": str(SAMPLE_ADAPTERS_DIR / n),
                      "pages": adapter_pages} for n in ADAPTERS],
    }]}


def start_router(stack: ExitStack, config: dict[str, Any], **settings: Any) -> RouterThread:
    """An in-process router over ``config``, stopped (then its loop closed) when ``stack`` closes."""
    loop = LoopThread()
    stack.callback(loop.close)
    router = RouterThread(loop, config, **settings)
    stack.callback(router.stop)
    return router


def openai_client(router: RouterThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=router.http_url + "/v1", api_key="unused", max_retries=0, timeout=60)


def check_each_prompts_output(client: openai.OpenAI, name: str, *, usage: bool) -> None:
    """Completions, streamed completions and chat give the fixture's output for every prompt; with ``usage``
    also the token counts, and a streamed chat that ends with them."""
    model = served_name(name)
    for prompt, want in zip(PROMPTS, OUTPUTS[name], strict=True):
        completion = client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
        assert completion.choices[0].text == want, (name, prompt)
        if usage:
            assert completion.usage is not None and completion.usage.completion_tokens == len(want.encode())
        stream = client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                           stream=True)
        assert "".join(chunk.choices[0].text for chunk in stream if chunk.choices) == want
        chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                              max_tokens=MAX_TOKENS, temperature=0)
        assert chat.choices[0].message.content == want and chat.model == model
        if usage:
            chunks = list(client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": prompt}], max_tokens=MAX_TOKENS, temperature=0,
                stream=True, stream_options={"include_usage": True},
            ))
            assert chunks[0].choices[0].delta.role == "assistant"
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
            assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len(want.encode())


def check_more_adapters_than_a_tier(router: RouterThread, *, rounds: int, threads: int) -> None:
    """Every adapter's every prompt ``rounds`` times over ``threads`` threads: each answer is right, and the
    router's books balance afterwards."""
    client = openai_client(router)
    jobs = [(name, index) for _ in range(rounds) for name in ADAPTERS for index in range(len(PROMPTS))]

    def ask(job: tuple[str, int]) -> tuple[str, str]:
        name, index = job
        answer = client.completions.create(model=served_name(name), prompt=PROMPTS[index], max_tokens=MAX_TOKENS,
                                           temperature=0)
        return answer.choices[0].text, OUTPUTS[name][index]

    with ThreadPoolExecutor(max_workers=threads) as pool:
        answers = list(pool.map(ask, jobs))
    assert all(got == want for got, want in answers)
    router.check_books()


def check_triton_endpoints_refused(router: RouterThread) -> None:
    """A pytorch fleet's router answers Triton's generate endpoint with 400 and a pointer to the OpenAI API."""
    answer = httpx.post(router.http_url + "/v2/models/tiny-upper/generate", timeout=30,
                        json={"text_input": "hello", "max_tokens": 4})
    assert answer.status_code == 400 and "use the OpenAI API" in answer.json()["error"]
