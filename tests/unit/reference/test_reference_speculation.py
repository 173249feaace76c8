"""Speculative decoding in the reference engine: the n-gram pool and the runtime controls (table tests), the
batcher's verification with a fake model (several tokens a step, stops inside a draft, sampled requests never
draft), and with the real tiny Llama: greedy outputs with speculation on are exactly those with it off, for the
base model and every adapter, in fewer steps, with the counters upstream exports."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from trtfleet_engines.reference.engine import build_batcher
from trtfleet_engines.reference.repository import build_reference_repository, lora_cache_bytes_for
from trtfleet_engines.reference.sampling import SamplingParams
from trtfleet_engines.reference.scheduler import GenerationRequest, InflightBatcher, LoraInputs
from trtfleet_engines.reference.settings import EngineSettings, settings_from_model_config
from trtfleet_engines.reference.speculation import NGramPool, SpeculationSettings, Speculator
from trtfleet_engines.reference.tokenizer import EOS_ID, prompt_ids

from tests.integration.reference.tiny import sample_adapters
from tests.unit.reference.fakes import FakeModel, limits, request, run_until_idle, triton_model_config

NGRAM = SpeculationSettings(mode="NGram", max_draft_len=4, max_matching_ngram_size=3)


@dataclass(frozen=True)
class PoolCase:
    sequences: tuple[tuple[str, tuple[int, ...]], ...]
    query: tuple[int, ...]
    max_len: int
    expected: tuple[int, ...]
    keep_all: bool = True
    use_oldest: bool = True
    public: bool = True


POOL_CASES = [
    pytest.param(PoolCase((("a", (1, 2, 3, 4, 1, 2)),), (1, 2, 3, 4, 1, 2), 3, (3, 4, 1)), id="own-text"),
    pytest.param(PoolCase((("a", (5, 6, 7, 5, 6, 8, 5, 6)),), (5, 6, 7, 5, 6, 8, 5, 6), 2, (7, 5)), id="oldest"),
    pytest.param(PoolCase((("a", (5, 6, 7, 5, 6, 8, 5, 6)),), (5, 6, 7, 5, 6, 8, 5, 6), 2, (8, 5),
                          use_oldest=False), id="newest"),
    pytest.param(PoolCase((("a", (5, 6, 7, 5, 6, 8, 5, 6)),), (5, 6, 7, 5, 6, 8, 5, 6), 2, (8, 5),
                          keep_all=False), id="keep-one"),
    pytest.param(PoolCase((("a", (1, 2, 3, 9)), ("b", (7, 1, 2))), (7, 1, 2), 2, (3, 9)), id="public-pool"),
    pytest.param(PoolCase((("a", (1, 2, 3, 9)), ("b", (7, 1, 2))), (7, 1, 2), 2, (), public=False),
                 id="private-pool"),
    pytest.param(PoolCase((("a", (4, 4, 4)),), (4, 4, 4), 0, ()), id="no-room"),
    pytest.param(PoolCase((("a", (1, 2, 3)),), (1, 2, 3), 5, ()), id="nothing-seen-before"),
    pytest.param(PoolCase((("a", (9, 1, 2, 3, 8, 2, 3)),), (9, 1, 2, 3, 8, 2, 3), 1, (8,)),
                 id="longest-suffix-first"),
]


@pytest.mark.parametrize("case", POOL_CASES)
def test_ngram_pool(case: PoolCase) -> None:
    pool = NGramPool(3, keep_all=case.keep_all, use_oldest=case.use_oldest, public=case.public)
    for key, tokens in case.sequences:
        for end in range(1, len(tokens) + 1):  # tokens arrive one step at a time
            pool.update(key, tokens[:end])
    assert pool.propose(case.sequences[-1][0], case.query, case.max_len) == case.expected


@pytest.mark.parametrize(
    ("settings", "active", "expected"),
    [
        pytest.param(NGRAM, 100, 4, id="no-controls"),
        pytest.param(replace(NGRAM, max_concurrency=2), 2, 4, id="within-concurrency"),
        pytest.param(replace(NGRAM, max_concurrency=2), 3, 0, id="above-concurrency"),
        pytest.param(replace(NGRAM, draft_len_schedule=((4, 4), (8, 2))), 6, 2, id="schedule"),
        pytest.param(replace(NGRAM, draft_len_schedule=((4, 4), (8, 2))), 9, 0, id="above-schedule"),
    ],
)
def test_runtime_controls(settings: SpeculationSettings, active: int, expected: int) -> None:
    assert Speculator(settings).draft_len(active) == expected


def test_low_acceptance_stops_speculation_for_good() -> None:
    speculator = Speculator(replace(NGRAM, acceptance_rate_window_size=2, acceptance_rate_threshold=0.5))
    speculator.record_iteration([(None, 4, 4)])
    speculator.record_iteration([(None, 4, 0)])
    assert not speculator.disabled, "0.5 is not below 0.5"
    speculator.record_iteration([(None, 4, 1)])
    assert speculator.disabled and speculator.draft_len(1) == 0
    speculator.record_iteration([(None, 4, 4), (7, 4, 4)])
    assert speculator.disabled
    assert (speculator.total.drafted, speculator.total.accepted) == (20, 13)
    assert speculator.last_iteration.acceptance_length == pytest.approx(5.0)
    assert (speculator.by_adapter[7].drafted, speculator.by_adapter[0].accepted) == (4, 9)


def _cycle_batcher(**settings: object) -> tuple[FakeModel, InflightBatcher[str]]:
    model = FakeModel(period=5)
    return model, InflightBatcher(model, limits(), speculator=Speculator(replace(NGRAM, **settings)))


def test_a_step_gives_a_request_every_draft_token_the_model_agrees_with() -> None:
    model, batcher = _cycle_batcher()
    batcher.submit(request([0, 1, 2, 3, 4, 0, 1], max_new_tokens=12, exclude_input_in_output=True), "a")
    (final,) = run_until_idle(batcher)
    assert final.output_ids == (2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2, 3)
    assert len(model.steps) == 4, "a prefill, then steps of 1 + 4 drafts, the last one cut to what is left"
    assert (final.draft_tokens, final.accepted_draft_tokens) == (8, 8)
    stats = batcher.stats()
    assert (stats.spec_draft_tokens, stats.spec_accepted_tokens, stats.output_tokens) == (8, 8, 12)
    assert stats.request_steps == 4


def test_a_rejected_draft_gives_the_models_own_token() -> None:
    _, batcher = _cycle_batcher()
    # The prompt says "1 2 -> 9" but the model says "2 -> 3": the one-token draft (room for one) is rejected.
    batcher.submit(request([1, 2, 9, 9, 1], max_new_tokens=3, exclude_input_in_output=True), "a")
    (final,) = run_until_idle(batcher)
    assert final.output_ids == (2, 3, 4)
    assert (final.draft_tokens, final.accepted_draft_tokens) == (1, 0)


def test_end_id_and_stop_words_inside_a_draft_end_the_request() -> None:
    _, batcher = _cycle_batcher()
    batcher.submit(request([0, 1, 2, 3, 4, 0, 1], max_new_tokens=12, end_id=4, exclude_input_in_output=True), "a")
    batcher.submit(request([0, 1, 2, 3, 4, 0, 1], max_new_tokens=12, stop_words=((3, 4),),
                           exclude_input_in_output=True), "b")
    outputs = {r.handle: r.output_ids for r in run_until_idle(batcher)}
    assert outputs == {"a": (2, 3), "b": (2, 3, 4)}


def test_streaming_sends_a_steps_tokens_together() -> None:
    _, batcher = _cycle_batcher()
    batcher.submit(request([0, 1, 2, 3, 4, 0, 1], max_new_tokens=7, streaming=True), "a")
    chunks = [r.output_ids for r in run_until_idle(batcher)]
    assert chunks == [(2,), (3, 4, 0, 1, 2), (3,)]


def test_sampled_requests_never_draft() -> None:
    model, batcher = _cycle_batcher()
    sampling = SamplingParams(temperature=0.7, top_k=3, seed=1)
    batcher.submit(request([0, 1, 2, 3, 4, 0, 1], max_new_tokens=6, sampling=sampling), "a")
    run_until_idle(batcher)
    assert all(size == 1 for step in model.steps[1:] for _, size, _ in step)
    assert batcher.stats().spec_draft_tokens == 0


def test_max_num_tokens_bounds_the_draft() -> None:
    model = FakeModel(period=5)
    batcher: InflightBatcher[str] = InflightBatcher(model, limits(max_num_tokens=8),
                                                    speculator=Speculator(NGRAM))
    batcher.submit(request([0, 1, 2, 3, 4, 0, 1], max_new_tokens=8), "a")
    batcher.submit(request([0, 1, 2, 3, 4, 0, 1], max_new_tokens=8), "b")
    run_until_idle(batcher)
    assert all(sum(size for _, size, _ in step) <= 8 for step in model.steps)


# -- the real tiny Llama ------------------------------------------------------------------------------------

PROMPTS = ("hello world", "abc abc abc", "the cat sat on the mat. the cat", '{"a": 1, "b": 2}')


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> EngineSettings:
    repo = build_reference_repository(tmp_path_factory.mktemp("repo"), lora_cache_host_bytes=lora_cache_bytes_for(4))
    return settings_from_model_config(triton_model_config(Path(repo) / "tensorrt_llm" / "config.pbtxt"))


def _request(text: str, task: int | None) -> GenerationRequest:
    lora = None
    if task is not None:
        adapter = list(sample_adapters().values())[task - 1]
        lora = LoraInputs(task, adapter.weights, adapter.config)
    return GenerationRequest(tuple(prompt_ids(text)), max_new_tokens=48, end_id=EOS_ID,
                             exclude_input_in_output=True, lora=lora)


def _outputs(settings: EngineSettings, *, batched: bool) -> tuple[dict[tuple[int | None, str], tuple[int, ...]],
                                                                 InflightBatcher[tuple[int | None, str]]]:
    batcher: InflightBatcher[tuple[int | None, str]] = build_batcher(settings)
    out: dict[tuple[int | None, str], tuple[int, ...]] = {}
    jobs = [(task, text) for task in (None, 1, 2, 3) for text in PROMPTS]
    for job in jobs:
        batcher.submit(_request(job[1], job[0]), job)
        if not batched:
            out |= {r.handle: r.output_ids for r in run_until_idle(batcher) if r.final}  # type: ignore[arg-type]
    out |= {r.handle: r.output_ids for r in run_until_idle(batcher, 2000) if r.final}  # type: ignore[arg-type]
    return out, batcher


@pytest.mark.parametrize("batched", [False, True], ids=["alone", "batched"])
def test_speculation_gives_exactly_the_greedy_outputs(settings: EngineSettings, batched: bool) -> None:
    off, plain = _outputs(settings, batched=batched)
    on, drafting = _outputs(replace(settings, speculation=NGRAM), batched=batched)
    assert on == off
    stats, baseline = drafting.stats(), plain.stats()
    assert stats.output_tokens == baseline.output_tokens
    assert stats.request_steps < baseline.request_steps, "drafts save steps on this text"
    assert 0 < stats.spec_accepted_tokens <= stats.spec_draft_tokens
    assert stats.output_tokens <= stats.request_steps + stats.spec_accepted_tokens, (
        "a step gives at most one token of its own plus the drafts it accepted (fewer when the request ends)")
    assert {task for task, _, _ in stats.spec_by_adapter} == {0, 1, 2, 3}
