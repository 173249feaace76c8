"""In-flight batching core of the reference engine, with a fake model implementing the real step protocol."""

from __future__ import annotations

import pytest
from trtfleet_engines.reference.errors import EnqueueRejected, QueueFullError
from trtfleet_engines.reference.kv_blocks import BlockPool, KvCacheSettings
from trtfleet_engines.reference.sampling import SamplingParams
from trtfleet_engines.reference.scheduler import InflightBatcher
from trtfleet_engines.reference.waiting_queue import WaitingQueuePolicy

from tests.unit.reference.fakes import FakeModel, adapter_store, limits, lora, request, run_until_idle


def test_non_streaming_returns_prompt_and_output_once() -> None:
    batcher: InflightBatcher[str] = InflightBatcher(FakeModel(), limits())
    batcher.submit(request([5, 6], max_new_tokens=3), "a")
    (response,) = run_until_idle(batcher)
    assert response.output_ids == (5, 6, 7, 8, 9)
    assert response.final and response.error is None and response.request_id == 1


def test_exclude_input_in_output() -> None:
    batcher: InflightBatcher[str] = InflightBatcher(FakeModel(), limits())
    batcher.submit(request([5, 6], max_new_tokens=3, exclude_input_in_output=True), "a")
    assert [r.output_ids for r in run_until_idle(batcher)] == [(7, 8, 9)]


def test_streaming_sends_each_new_token_and_drops_end_id() -> None:
    batcher: InflightBatcher[str] = InflightBatcher(FakeModel(), limits())
    batcher.submit(request([5], max_new_tokens=10, streaming=True, end_id=9), "a")
    responses = run_until_idle(batcher)
    assert [(r.output_ids, r.final) for r in responses] == [
        ((6,), False),
        ((7,), False),
        ((8,), False),
        ((), True),
    ]


def test_streaming_last_token_carries_the_final_flag() -> None:
    batcher: InflightBatcher[str] = InflightBatcher(FakeModel(), limits())
    batcher.submit(request([5], max_new_tokens=2, streaming=True), "a")
    assert [(r.output_ids, r.final) for r in run_until_idle(batcher)] == [((6,), False), ((7,), True)]


def test_stop_words_end_the_sequence_and_stay_in_the_output() -> None:
    batcher: InflightBatcher[str] = InflightBatcher(FakeModel(), limits())
    batcher.submit(request([1], max_new_tokens=20, stop_words=((4, 5),), exclude_input_in_output=True), "a")
    assert [r.output_ids for r in run_until_idle(batcher)] == [(2, 3, 4, 5)]


def test_a_short_request_overtakes_a_long_one_in_the_same_batches() -> None:
    model = FakeModel()
    batcher: InflightBatcher[str] = InflightBatcher(model, limits())
    batcher.submit(request([1], max_new_tokens=30), "long")
    batcher.step()
    batcher.step()
    batcher.submit(request([100, 101, 102], max_new_tokens=2), "short")
    batcher.step()
    stats = batcher.stats()
    assert (stats.scheduled_requests, stats.context_requests, stats.generation_requests) == (2, 1, 1)
    assert stats.context_tokens == 3 and stats.active_requests == 2
    finished = [r.handle for r in run_until_idle(batcher) if r.final]
    assert finished == ["short", "long"]
    # The short request's prefill (3 tokens) ran in the same step as the long one's decode (1 token).
    assert sorted(n for _, n, _ in model.steps[2]) == [1, 3]
    assert sorted(n for _, n, _ in model.steps[3]) == [1, 1]


def test_max_batch_size_limits_active_requests() -> None:
    model = FakeModel()
    batcher: InflightBatcher[str] = InflightBatcher(model, limits(max_batch_size=2))
    for name in "abc":
        batcher.submit(request([1], max_new_tokens=3), name)
    batcher.step()
    assert batcher.stats().active_requests == 2 and batcher.stats().waiting_requests == 1
    run_until_idle(batcher)
    assert max(len(rows) for rows in model.steps) == 2


def test_max_num_tokens_defers_prefills_that_do_not_fit() -> None:
    model = FakeModel()
    batcher: InflightBatcher[str] = InflightBatcher(model, limits(max_num_tokens=10))
    batcher.submit(request(range(8), max_new_tokens=2), "a")
    batcher.submit(request(range(8), max_new_tokens=2), "b")
    run_until_idle(batcher)
    assert all(sum(n for _, n, _ in rows) <= 10 for rows in model.steps)
    assert [n for _, n, _ in model.steps[0]] == [8]
    assert sorted(n for _, n, _ in model.steps[1]) == [1, 8]


def test_queue_limit_has_the_executor_text() -> None:
    batcher: InflightBatcher[str] = InflightBatcher(FakeModel(), limits(max_queue_size=2))
    batcher.submit(request([1]), "a")
    batcher.submit(request([1]), "b")
    with pytest.raises(QueueFullError) as info:
        batcher.submit(request([1]), "c")
    assert info.value.text == "Maximum queue size of 2 has been reached, please try again later"


def test_prompt_longer_than_max_input_len_is_refused() -> None:
    batcher: InflightBatcher[str] = InflightBatcher(FakeModel(), limits(max_input_len=4))
    with pytest.raises(EnqueueRejected, match=r"Prompt length \(5\) exceeds maximum input length \(4\)"):
        batcher.submit(request(range(5)), "a")


def test_prompt_longer_than_one_step_is_refused() -> None:
    batcher: InflightBatcher[str] = InflightBatcher(FakeModel(), limits(max_num_tokens=4))
    with pytest.raises(EnqueueRejected, match=r"Prompt length \(5\) exceeds max_num_tokens \(4\)"):
        batcher.submit(request(range(5)), "a")


def test_max_seq_len_caps_the_output() -> None:
    batcher: InflightBatcher[str] = InflightBatcher(FakeModel(), limits(max_seq_len=6))
    batcher.submit(request([1, 2], max_new_tokens=50, exclude_input_in_output=True), "a")
    assert [r.output_ids for r in run_until_idle(batcher)] == [(3, 4, 5, 6)]


def test_stop_request_cancels_by_triton_request_id() -> None:
    batcher: InflightBatcher[str] = InflightBatcher(FakeModel(), limits())
    batcher.submit(request([1], max_new_tokens=50, streaming=True, user_id="r-1"), "a")
    batcher.submit(request([1], max_new_tokens=2, user_id="r-2"), "b")
    first = batcher.step()
    assert batcher.cancel_user_request("r-1") == 1
    rest = run_until_idle(batcher)
    finals = {r.handle: r for r in first + rest if r.final}
    assert finals["a"].output_ids == () and finals["a"].error is None
    assert finals["b"].output_ids == (1, 2, 3)
    assert sum(1 for r in first + rest if r.handle == "a") <= 2  # one token, then the cancellation


def test_cancel_a_waiting_request() -> None:
    batcher: InflightBatcher[str] = InflightBatcher(FakeModel(), limits(max_batch_size=1))
    batcher.submit(request([1], max_new_tokens=3), "a")
    request_id = batcher.submit(request([1], max_new_tokens=3), "b")
    batcher.cancel(request_id)
    responses = run_until_idle(batcher)
    assert [(r.handle, r.output_ids) for r in responses] == [("b", (1,)), ("a", (1, 2, 3, 4))]


def test_same_tokens_alone_and_batched_with_sampling() -> None:
    sampling = SamplingParams(temperature=0.8, top_k=5, top_p=0.9, seed=7)
    alone: InflightBatcher[str] = InflightBatcher(FakeModel(), limits())
    alone.submit(request([3], max_new_tokens=5, sampling=sampling), "x")
    expected = run_until_idle(alone)[0].output_ids
    batched: InflightBatcher[str] = InflightBatcher(FakeModel(), limits())
    for name in "abc":
        batched.submit(request([3], max_new_tokens=5, sampling=sampling), name)
    assert {r.output_ids for r in run_until_idle(batched)} == {expected}


def test_requests_with_different_adapters_share_a_step() -> None:
    model = FakeModel()
    store, _ = adapter_store()
    batcher: InflightBatcher[str] = InflightBatcher(model, limits(), store)
    batcher.submit(request([10], max_new_tokens=2, exclude_input_in_output=True, lora=lora(1, shift=10)), "a1")
    batcher.submit(request([10], max_new_tokens=2, exclude_input_in_output=True, lora=lora(2, shift=20)), "a2")
    batcher.submit(request([10], max_new_tokens=2, exclude_input_in_output=True), "base")
    outputs = {r.handle: r.output_ids for r in run_until_idle(batcher)}
    assert outputs == {"a1": (21, 32), "a2": (31, 52), "base": (11, 12)}
    assert {a.shift if a else 0 for _, _, a in model.steps[0]} == {0, 10, 20}


def test_abort_all_fails_everything_and_releases_adapters() -> None:
    store, _ = adapter_store()
    batcher: InflightBatcher[str] = InflightBatcher(FakeModel(), limits(max_batch_size=1), store)
    batcher.submit(request([1], max_new_tokens=9, lora=lora(1)), "a")
    batcher.submit(request([1], max_new_tokens=9), "b")
    batcher.step()
    responses = batcher.abort_all("bye")
    assert [(r.handle, r.error, r.final) for r in responses] == [("b", "bye", True), ("a", "bye", True)]
    assert not batcher.has_work() and not store.cache.in_use(1)


def small_pool(max_blocks: int) -> BlockPool:
    return BlockPool(KvCacheSettings(max_blocks=max_blocks, tokens_per_block=4, enable_block_reuse=False))


def test_a_request_waits_until_the_kv_cache_can_hold_it() -> None:
    model = FakeModel()
    batcher: InflightBatcher[str] = InflightBatcher(model, limits(), kv_cache=small_pool(3))
    batcher.submit(request(range(6), max_new_tokens=2), "a")  # 8 tokens: 2 blocks of 4
    batcher.submit(request(range(6), max_new_tokens=2), "b")  # 2 more: only 1 is left while "a" runs
    batcher.step()
    stats = batcher.stats()
    assert (stats.context_requests, stats.kv_used_blocks, stats.kv_max_blocks) == (1, 2, 3)
    finished = [r.handle for r in run_until_idle(batcher) if r.final]
    assert finished == ["a", "b"]
    assert [n for _, n, _ in model.steps[0]] == [6] and [n for _, n, _ in model.steps[2]] == [6]


def test_a_request_the_kv_cache_can_never_hold_is_refused() -> None:
    batcher: InflightBatcher[str] = InflightBatcher(FakeModel(), limits(), kv_cache=small_pool(3))
    with pytest.raises(EnqueueRejected, match=r"needs 4 KV-cache blocks of 4 tokens .* the cache has 3"):
        batcher.submit(request(range(10), max_new_tokens=6), "a")


@pytest.mark.parametrize(
    ("policy", "finished"),
    [
        pytest.param(WaitingQueuePolicy.FCFS, ["busy", "low", "default", "high", "high-later"], id="fcfs"),
        pytest.param(WaitingQueuePolicy.PRIORITY, ["busy", "high", "high-later", "default", "low"], id="priority"),
    ],
)
def test_the_waiting_queue_orders_by_priority_when_configured(policy: WaitingQueuePolicy, finished: list[str]) -> None:
    batcher: InflightBatcher[str] = InflightBatcher(FakeModel(), limits(max_batch_size=1), waiting_policy=policy)
    batcher.submit(request([1], max_new_tokens=3), "busy")
    batcher.step()  # the one slot is taken: the rest wait
    for handle, priority in [("low", 0.1), ("default", 0.5), ("high", 0.9), ("high-later", 0.9)]:
        batcher.submit(request([2], max_new_tokens=1, priority=priority), handle)
    assert [r.handle for r in run_until_idle(batcher) if r.final] == finished


def test_a_cancelled_request_leaves_the_priority_queue() -> None:
    batcher: InflightBatcher[str] = InflightBatcher(
        FakeModel(), limits(max_batch_size=1), waiting_policy=WaitingQueuePolicy.PRIORITY
    )
    batcher.submit(request([1], max_new_tokens=2), "busy")
    batcher.step()
    gone = batcher.submit(request([2], max_new_tokens=1, priority=1.0), "gone")
    batcher.submit(request([3], max_new_tokens=1, priority=0.0), "kept")
    batcher.cancel(gone)
    assert batcher.stats().waiting_requests == 2
    finals = [(r.handle, r.output_ids) for r in run_until_idle(batcher) if r.final]
    assert finals[0][0] == "gone" and [h for h, _ in finals] == ["gone", "busy", "kept"]
