"""The reference engine's pytorch mode as trtllm-serve: the openai client, adapters by path, tiers, errors.

Every server is a real subprocess (``python -m trtfleet_engines.reference.serve``); the main one reads the
options file trtfleet renders for the reference BaseModel. Expected greedy outputs are the fixture the Triton
reference engine is tested against (``tests/fixtures/lora/expected_outputs.json``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from trtfleet_engines.pytorch.options import build_llm_api_options, render_llm_api_options
from trtfleet_engines.reference.repository import default_reference_spec

from tests.integration.reference.serve_process import ServeProcess, lora_request, serving
from tests.integration.reference.triton_client import wait_until
from tests.support.lora_outputs import OUTPUTS, PROMPTS, SAMPLE_ADAPTERS

pytestmark = pytest.mark.integration

ADAPTERS = SAMPLE_ADAPTERS
TASK_IDS = {"upper": 1, "reverse": 2, "json": 3}
MAX_TOKENS = 64


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    tmp = tmp_path_factory.mktemp("serve")
    options = tmp / "llm-api-options.yaml"
    options.write_text(render_llm_api_options(default_reference_spec()))
    with serving(tmp, ["--config", str(options), "--served_model_name", "tiny"]) as process:
        yield process


def _extra(name: str) -> dict[str, Any] | None:
    return None if name == "base" else lora_request(name, TASK_IDS[name])


@pytest.mark.parametrize("name", ["base", *ADAPTERS])
def test_openai_outputs_match_the_triton_reference(server: ServeProcess, name: str) -> None:
    client = server.client()
    for prompt, want in zip(PROMPTS, OUTPUTS[name], strict=True):
        completion = client.completions.create(model="tiny", prompt=prompt, max_tokens=MAX_TOKENS,
                                               temperature=0, extra_body=_extra(name))
        assert completion.choices[0].text == want, (name, prompt)
        assert completion.choices[0].finish_reason == "stop"
        streamed = client.completions.create(model="tiny", prompt=prompt, max_tokens=MAX_TOKENS, stream=True,
                                             extra_body=_extra(name))
        assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == want
        chat = client.chat.completions.create(model="any name", messages=[{"role": "user", "content": prompt}],
                                              max_tokens=MAX_TOKENS, extra_body=_extra(name))
        assert chat.choices[0].message.content == want and chat.model == "any name"
        stream = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": prompt}],
                                                max_completion_tokens=MAX_TOKENS, stream=True,
                                                stream_options={"include_usage": True}, extra_body=_extra(name))
        chunks = list(stream)
        assert chunks[0].choices[0].delta.role == "assistant"
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len(want.encode())


def test_tiers_come_from_the_options_file(server: ServeProcess) -> None:
    lora = build_llm_api_options(default_reference_spec())["lora_config"]
    cache = server.lora_cache()
    assert (cache["maxLoras"], cache["maxCpuLoras"]) == (lora["max_loras"], lora["max_cpu_loras"])
    assert cache["hostAdapters"] >= lora["max_cpu_loras"] and cache["deviceAdapters"] >= lora["max_loras"]


def test_lora_int_id_is_the_cache_key(server: ServeProcess) -> None:
    client = server.client()
    prompt = PROMPTS[0]
    first = client.completions.create(model="tiny", prompt=prompt, max_tokens=MAX_TOKENS,
                                      extra_body=lora_request("seven", 7, "upper"))
    assert first.choices[0].text == OUTPUTS["upper"][0]
    loads = server.lora_cache()["loads"].count(7)
    # same id, another (existing) path: the cached weights answer and nothing is read again
    again = client.completions.create(model="tiny", prompt=prompt, max_tokens=MAX_TOKENS,
                                      extra_body=lora_request("seven", 7, "reverse"))
    assert again.choices[0].text == OUTPUTS["upper"][0]
    assert server.lora_cache()["loads"].count(7) == loads == 1


def test_routes(server: ServeProcess) -> None:
    health = server.get("/health")
    assert health.status_code == 200 and health.content == b""
    generate = server.get("/health_generate")
    assert (generate.status_code, generate.text) == (200, "Generation health check OK")
    assert "version" in server.get("/version").json()
    models = server.get("/v1/models").json()
    assert models["object"] == "list" and [card["id"] for card in models["data"]] == ["tiny"]
    assert models["data"][0]["owned_by"] == "tensorrt_llm"
    stats = server.get("/metrics").json()
    assert isinstance(stats, list) and stats and {"iter", "numActiveRequests", "kvCacheStats"} <= set(stats[-1])
    text = server.get("/prometheus/metrics").text
    assert 'trtllm_request_success_total{engine_type="undefined",finished_reason="stop",model_name="undefined"}' in text
    assert "trtfleet_reference_lora_loads_total" in text


@pytest.mark.parametrize(
    ("path", "body", "needle"),
    [
        pytest.param("/v1/completions", {"model": "t", "prompt": "a", "suffix": "b"}, "suffix", id="unknown-field"),
        pytest.param("/v1/completions", {"prompt": "a"}, "model", id="no-model"),
        pytest.param("/v1/completions", {"model": "t", "prompt": "a",
                                         "lora_request": {"lora_name": "x", "lora_int_id": 9, "lora_path": "/no"}},
                     "lora_path (/no) does not exist.", id="missing-path"),
        pytest.param("/v1/completions", {"model": "t", "prompt": "a",
                                         "lora_request": {"lora_name": "x", "lora_int_id": 9}},
                     "lora_path () does not exist.", id="no-path"),
        pytest.param("/v1/completions", {"model": "t", "prompt": "a", "stream_options": {"include_usage": True}},
                     "stream", id="stream-options-without-stream"),
        pytest.param("/v1/chat/completions", {"model": "t", "messages": [{"role": "user", "content": "a"}],
                                              "max_tokens": 2, "max_completion_tokens": 2}, "exclusive",
                     id="two-limits"),
        pytest.param("/v1/completions", {"model": "t", "prompt": "a", "priority": 2}, "priority", id="priority"),
    ],
)
def test_validation_is_400_with_error_text(server: ServeProcess, path: str, body: dict[str, Any],
                                           needle: str) -> None:
    response = server.post(path, body)
    assert response.status_code == 400
    assert set(response.json()) == {"error"} and needle in response.json()["error"]


def test_refusals_are_400_error_responses(server: ServeProcess, tmp_path: Path) -> None:
    not_an_adapter = tmp_path / "empty"
    not_an_adapter.mkdir()
    bad = {"lora_request": {"lora_name": "bad", "lora_int_id": 99, "lora_path": str(not_an_adapter)}}
    too_long = {"model": "t", "prompt": "x" * 2100}
    for body, needle in (({"model": "t", "prompt": "a", **bad}, "Failed to load LoRA adapter"),
                         (too_long, "should not exceed max_num_tokens (2048)")):
        response = server.post("/v1/completions", body)
        assert response.status_code == 400
        error = response.json()
        assert (error["object"], error["type"], error["code"]) == ("error", "BadRequestError", 400)
        assert needle in error["message"]
    with pytest.raises(openai.BadRequestError):
        server.client().completions.create(model="t", prompt="a", extra_body=bad)


def test_without_lora_config_lora_request_is_ignored(tmp_path: Path) -> None:
    with serving(tmp_path) as plain:
        completion = plain.client().completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=MAX_TOKENS,
                                                       extra_body=lora_request("upper", 1))
        assert completion.choices[0].text == OUTPUTS["base"][0]
        assert plain.get("/reference/lora_cache").status_code == 404


def test_more_adapters_than_device_slots_wait_and_a_disconnect_frees_one(tmp_path: Path) -> None:
    # 240 steps of 50 ms keep the holders pinned for 12 s unless their clients go away
    args = ["--max-loras", "1", "--max-cpu-loras", "4", "--min-step-ms", "50"]
    with serving(tmp_path, args) as small:
        device_slots = small.lora_cache()["deviceAdapters"]
        assert device_slots == 2  # one max-rank adapter's slots round up to two pages of the tiny model
        client = small.client()
        holders = [
            client.completions.create(model="t", prompt="hold", max_tokens=240, stream=True, extra_body={
                "ignore_eos": True, **lora_request(f"hold{i}", 100 + i, ADAPTERS[i])})
            for i in range(device_slots)
        ]
        for holder in holders:
            next(iter(holder))  # a first token: the adapter is on the device and stays pinned
        answer: list[str] = []
        waiting = threading.Thread(target=lambda: answer.append(client.completions.create(
            model="t", prompt=PROMPTS[1], max_tokens=MAX_TOKENS, extra_body=lora_request("reverse", 2),
        ).choices[0].text))
        waiting.start()
        wait_until(lambda: small.lora_cache()["deviceWaits"] > 0)
        assert not answer  # it waits, it does not fail
        holders[0].close()  # the client goes away: its request is cancelled and its device pages freed
        waiting.join(timeout=60)
        assert answer == [OUTPUTS["reverse"][1]]
        cache = small.lora_cache()
        assert cache["peakDeviceInUse"] == device_slots
        assert 100 not in cache["inFlight"]
        holders[1].close()
        wait_until(lambda: small.lora_cache()["inFlight"] == {})
        # a non-streaming client that gives up: its request is cancelled too (12 s of steps left)
        cancelled = _cancelled(small)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(small.url + "/v1/completions", timeout=0.5,
                       json={"model": "t", "prompt": "hold", "max_tokens": 240, "ignore_eos": True})
        wait_until(lambda: _cancelled(small) == cancelled + 1)


def _cancelled(server: ServeProcess) -> float:
    for line in server.get("/prometheus/metrics").text.splitlines():
        if line.startswith("trtllm_request_success_total{") and 'finished_reason="cancelled"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_eviction_is_lru_and_a_cold_adapter_is_read_again(tmp_path: Path) -> None:
    with serving(tmp_path, ["--max-loras", "1", "--max-cpu-loras", "1"]) as small:
        assert small.lora_cache()["hostAdapters"] == 2
        client = small.client()
        order = [("upper", 11), ("reverse", 12), ("json", 13), ("reverse", 12), ("upper", 11)]
        for name, task_id in order:
            completion = client.completions.create(model="t", prompt=PROMPTS[0], max_tokens=MAX_TOKENS,
                                                   extra_body=lora_request(name, task_id))
            assert completion.choices[0].text == OUTPUTS[name][0], (name, task_id)
        cache = small.lora_cache()
        assert cache["loads"] == [11, 12, 13, 11]  # 12 was a hit; 11 was evicted, so it is read again
        assert cache["hostEvictions"] == [11, 13]  # least recently used first: 13 lost to the touched 12
        assert cache["hostResident"] == [12, 11]
        text = small.get("/prometheus/metrics").text
        assert 'trtfleet_reference_lora_evictions_total{tier="host"} 2.0' in text


def test_options_file_round_trips_through_yaml() -> None:
    assert yaml.safe_load(render_llm_api_options(default_reference_spec())) == build_llm_api_options(
        default_reference_spec()
    )
