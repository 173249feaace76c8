"""Prompt hashing is lazy: only a policy that prices prefixes makes the fleet hash a prompt, and then once."""

from __future__ import annotations

import random

import pytest
from trtfleet_router.chat import chat_renderer
from trtfleet_router.models_registry import (
    BYTES_PER_TOKEN_DEFAULT,
    BYTES_PER_TOKEN_REFERENCE,
    BaseModelEntry,
    EngineLimits,
)
from trtfleet_router.routing import Fleet, Outcome, PodInfo, RouteRequest, build_policy, parse_routing_config
from trtfleet_router.routing.prefix import (
    PromptBlocks,
    payload_block_hashes,
    reference_prompt_payload,
    text_block_hashes,
    token_block_hashes,
)


class CountedBlocks:
    """A prompt's blocks whose hashing is counted."""

    def __init__(self, tokens: int = 256) -> None:
        self.calls = 0
        self.expected = token_block_hashes(list(range(tokens)), 0, 32).hashes
        self.blocks = PromptBlocks.lazy(self._compute, 32, True)

    def _compute(self) -> tuple[int, ...]:
        self.calls += 1
        return self.expected


def fleet(policy: str) -> Fleet:
    config = parse_routing_config({"policy": policy})
    f = Fleet(build_policy(config), now=lambda: 0.0, rng=random.Random(0), config=config, model="m")
    f.set_pods({pod: PodInfo(pod, f"{pod}:1", f"u-{pod}", 4, 4) for pod in ("p0", "p1")})
    return f


@pytest.mark.parametrize(
    ("policy", "hashed", "held"),
    [
        ("ttft-cost", 1, 8),
        ("dynamo-kv", 1, 8),
        ("llmd-default", 1, 8),
        ("kubeai-prefix-hash", 1, 8),
        ("adapter-affinity", 0, 0),
        ("round-robin", 0, 0),
        ("least-load", 0, 0),
        ("chwbl", 0, 0),
    ],
)
def test_the_prompt_is_hashed_once_and_only_for_policies_that_price_prefixes(
    policy: str, hashed: int, held: int
) -> None:
    f = fleet(policy)
    counted = CountedBlocks()
    request = RouteRequest("m", None, 256, 16, blocks=counted.blocks)
    for _ in range(2):  # a retry routes the same request again
        decision = f.route(request)
    f.finish(f.start(decision, request), Outcome.OK)
    assert counted.calls == hashed
    assert sum(f.prefix_index.blocks_held(pod) for pod in ("p0", "p1")) == held
    f.check_invariants()


def test_lazy_blocks_equal_eager_ones() -> None:
    counted = CountedBlocks(100)
    assert not counted.blocks.computed
    assert counted.blocks == PromptBlocks(counted.expected, 32, True)
    assert counted.blocks.computed and counted.blocks.tokens == 96 and counted.calls == 1


PROMPT = "a system prompt shared by every turn, " * 12 + "ü then the turn itself"


@pytest.mark.parametrize(
    ("bytes_per_token", "eager"),
    [
        (BYTES_PER_TOKEN_REFERENCE, payload_block_hashes(reference_prompt_payload(PROMPT), 7, 32)),
        (BYTES_PER_TOKEN_DEFAULT, text_block_hashes(PROMPT, 7, 32, BYTES_PER_TOKEN_DEFAULT)),
    ],
    ids=["reference exact tokens", "character chunks"],
)
def test_the_front_ends_blocks_are_lazy_and_the_same(bytes_per_token: float, eager: PromptBlocks) -> None:
    base = BaseModelEntry("m", "reference", EngineLimits(4096, 4096), chat_renderer("reference"),
                          bytes_per_token=bytes_per_token)
    blocks = base.prompt_blocks(PROMPT, 7)
    assert not blocks.computed
    assert blocks == eager and len(blocks.hashes) > 1
