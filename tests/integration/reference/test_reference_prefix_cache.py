"""KV-cache block reuse in the reference pytorch mode, seen from outside as a router sees trtllm-serve.

Real subprocesses: one server with reuse on and KV events enabled (``kv_cache_config`` in the options file
trtfleet renders, plus ``tokens_per_block`` 16 and ``event_buffer_max_size``), one with reuse off for the
answers to compare. A second turn sharing a long prefix must report reused blocks (``/metrics``
``kvCacheStats``, ``usage.prompt_tokens_details.cached_tokens``), compute fewer prefill positions (the
reference counter) and answer exactly as without reuse; ``POST /kv_cache_events`` must carry the blocks a
router can hash itself. An adapter has its own key space.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from trtfleet_engines.pytorch.options import render_llm_api_options
from trtfleet_engines.reference.kv_blocks import chained_block_hashes
from trtfleet_engines.reference.repository import default_reference_spec
from trtfleet_engines.reference.tokenizer import prompt_ids

from tests.integration.reference.serve_process import ServeProcess, lora_request, serving

pytestmark = pytest.mark.integration

TPB = 16
FIRST = "You are a terse assistant for the trtfleet operators. Answer in one line, cite the runbook. Q: why?"
SECOND = FIRST + " A: the pod was cold. Q: and now, after the second turn of this conversation?"
MAX_TOKENS = 6


def options_file(tmp: Path, **kv_cache: Any) -> Path:
    options = yaml.safe_load(render_llm_api_options(default_reference_spec()))
    options["kv_cache_config"].update(kv_cache)
    path = tmp / f"options-{len(list(tmp.iterdir()))}.yaml"
    path.write_text(yaml.safe_dump(options))
    return path


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServeProcess, ServeProcess]]:
    tmp = tmp_path_factory.mktemp("prefix")
    reusing = options_file(tmp, tokens_per_block=TPB, event_buffer_max_size=1000, enable_block_reuse=True)
    plain = options_file(tmp, tokens_per_block=TPB, enable_block_reuse=False)
    with serving(tmp, ["--config", str(reusing)]) as server, serving(tmp, ["--config", str(plain)]) as baseline:
        yield server, baseline


def complete(server: ServeProcess, prompt: str, adapter: tuple[str, int] | None = None) -> tuple[str, int]:
    """(text, cached prompt tokens) of one greedy completion."""
    extra = lora_request(*adapter) if adapter else None
    completion = server.client().completions.create(model="tiny", prompt=prompt, max_tokens=MAX_TOKENS,
                                                    temperature=0.0, extra_body=extra)
    usage = completion.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    return completion.choices[0].text, usage.prompt_tokens_details.cached_tokens or 0


def kv_stats(server: ServeProcess) -> dict[str, Any]:
    entries = server.get("/metrics").json()
    assert entries, "no iteration stats since the last call"
    stats: dict[str, Any] = entries[-1]["kvCacheStats"]
    return stats


def counter(server: ServeProcess, name: str) -> float:
    text = server.get("/prometheus/metrics").text
    found = re.search(rf"^{name} ([0-9.e+]+)$", text, re.MULTILINE)
    assert found, name
    return float(found.group(1))


def stored_blocks(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [block for event in events if event["data"]["type"] == "stored" for block in event["data"]["blocks"]]


def test_a_second_turn_reuses_the_prefix_skips_its_prefill_and_answers_the_same(
    servers: tuple[ServeProcess, ServeProcess],
) -> None:
    server, baseline = servers
    created = server.post("/kv_cache_events", {}).json()
    assert created[0]["data"]["type"] == "created" and created[0]["event_id"] == 0
    first_ids, second_ids = prompt_ids(FIRST), prompt_ids(SECOND)
    first_blocks = len(first_ids) // TPB

    first_text, first_cached = complete(server, FIRST)
    assert first_cached == 0 and first_text == complete(baseline, FIRST)[0]
    events = server.post("/kv_cache_events", {}).json()
    blocks = stored_blocks(events)
    assert [b["block_hash"] for b in blocks] == chained_block_hashes(first_ids, TPB, None)  # a router's own hashes
    assert [[t["token_id"] for t in b["tokens"]] for b in blocks] == [
        first_ids[i : i + TPB] for i in range(0, first_blocks * TPB, TPB)
    ]
    assert events[0]["data"]["parent_hash"] is None and events[0]["window_size"] == 256
    kv_stats(server)  # drain

    computed_before = counter(server, "trtfleet_reference_prefill_tokens_computed_total")
    second_text, second_cached = complete(server, SECOND)
    assert second_cached == first_blocks * TPB
    assert second_text == complete(baseline, SECOND)[0]  # reuse changes nothing in the answer
    computed = counter(server, "trtfleet_reference_prefill_tokens_computed_total") - computed_before
    assert computed == len(second_ids) - first_blocks * TPB
    stats = kv_stats(server)
    first_missed = -(-len(first_ids) // TPB)
    assert stats["reusedBlocks"] == first_blocks  # cumulative since start
    assert stats["missedBlocks"] == first_missed + -(-len(second_ids) // TPB) - first_blocks
    looked_up = stats["reusedBlocks"] + stats["missedBlocks"]
    assert stats["cacheHitRate"] == pytest.approx(stats["reusedBlocks"] / looked_up)
    assert stats["tokensPerBlock"] == TPB and stats["usedNumBlocks"] == 0
    later = stored_blocks(server.post("/kv_cache_events", {}).json())
    assert [b["block_hash"] for b in later] == chained_block_hashes(second_ids, TPB, None)[first_blocks:]


def test_an_adapter_never_reuses_the_base_models_blocks(servers: tuple[ServeProcess, ServeProcess]) -> None:
    server, baseline = servers
    prompt = SECOND + " (adapter)"
    complete(server, prompt)  # the base model caches this prompt's blocks
    server.post("/kv_cache_events", {})
    text, cached = complete(server, prompt, ("upper", 1))
    assert cached == 0
    ids = prompt_ids(prompt)
    hashes = [b["block_hash"] for b in stored_blocks(server.post("/kv_cache_events", {}).json())]
    assert hashes == chained_block_hashes(ids, TPB, 1) != chained_block_hashes(ids, TPB, None)
    again, cached_again = complete(server, prompt, ("upper", 1))
    assert cached_again == (len(ids) - 1) // TPB * TPB
    assert again == text == complete(baseline, prompt, ("upper", 1))[0]
