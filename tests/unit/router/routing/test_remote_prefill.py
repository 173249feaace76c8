"""Other router replicas' prefill in a pod's queue: booked from their ``put``/``acquire`` events, ended by their
``loaded`` (first token), ``release`` or their loss, so every replica prices a pod's queue alike (``trtfleet``).

Two :class:`Fleet` objects over the same pods, as in ``test_remote.py``: each records its own events and
the test delivers them to the other when it chooses.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from trtfleet_router.routing import Decision, Outcome, RouteRequest
from trtfleet_router.routing.events import EventKind, ResidencyEvent

from .test_remote import World, adapter, prompt

PROMPT_TOKENS = 2048  # 64 blocks of 32 tokens


@dataclass(frozen=True)
class EndCase:
    name: str
    cold: bool  # the request carries the adapter's weights (the pod's view is cold)
    end: str  # "first-token" (confirm, then first token, as the router does), "release" (failed), "forget"
    events: tuple[EventKind, ...]  # what the origin published


END_CASES = (
    EndCase("warm-first-token", False, "first-token", (EventKind.ACQUIRE, EventKind.LOADED)),
    EndCase("cold-first-token", True, "first-token", (EventKind.PUT, EventKind.LOADED)),
    EndCase("warm-fails-before-first-token", False, "release", (EventKind.ACQUIRE, EventKind.RELEASE)),
    EndCase("origin-lost", False, "forget", (EventKind.ACQUIRE,)),
)


def kinds(events: list[ResidencyEvent]) -> tuple[EventKind, ...]:
    return tuple(event.kind for event in events)


@pytest.mark.parametrize("case", END_CASES, ids=lambda c: c.name)
def test_a_remote_requests_prefill_queues_until_its_first_token(case: EndCase) -> None:
    world = World()
    a, b = world.replicas
    subject = adapter(1)
    if not case.cold:  # warm on p0 for both, through b (b's own events are not delivered: a learns nothing new)
        a.fleet.finish(a.start("p0", subject), Outcome.OK)
        world.deliver()
    request = prompt(subject, PROMPT_TOKENS)
    ticket = a.fleet.start(Decision("p0", case.cold, not case.cold, "test", "setup"), request)
    assert a.fleet.prefix_index.pending_prefill_tokens("p0") == PROMPT_TOKENS
    published = list(a.outbox)
    world.deliver()
    assert b.fleet.prefix_index.pending_prefill_tokens("p0") == PROMPT_TOKENS  # the same queue in both views
    if case.end == "first-token":
        a.fleet.confirm(ticket)
        a.fleet.first_token(ticket)
    elif case.end == "release":
        a.fleet.finish(ticket, Outcome.FAILED)
    published += a.outbox
    world.deliver()
    if case.end == "forget":
        assert b.fleet.forget_origin("r0") == 1
    assert kinds(published) == case.events
    assert b.fleet.prefix_index.pending_prefill_tokens("p0") == 0
    if case.end != "forget":  # a lost origin's own view is not ours to end
        assert a.fleet.prefix_index.pending_prefill_tokens("p0") == 0
    if case.end == "first-token":  # the first token's loaded leaves the request in flight: only its release ends it
        assert b.fleet.remote.inflight("p0", b.fleet.pods["p0"].uid) == 1
        a.fleet.finish(ticket, Outcome.OK)
        world.deliver()
        assert b.fleet.remote.inflight("p0", b.fleet.pods["p0"].uid) == 0
    world.check()


def test_a_cached_prefix_is_not_queued_as_prefill_by_either_replica() -> None:
    world = World()
    a, b = world.replicas
    subject = adapter(1)
    first = prompt(subject, PROMPT_TOKENS)
    a.fleet.finish(a.fleet.start(Decision("p0", True, False, "test", "setup"), first), Outcome.OK)
    world.deliver()
    second = prompt(subject, 2 * PROMPT_TOKENS)  # the first turn's blocks, then as many new ones
    a.fleet.start(Decision("p0", False, True, "test", "setup"), second)
    world.deliver()
    assert a.fleet.prefix_index.pending_prefill_tokens("p0") == PROMPT_TOKENS
    assert b.fleet.prefix_index.pending_prefill_tokens("p0") == PROMPT_TOKENS
    world.check()


def test_a_first_token_after_the_end_publishes_nothing_more() -> None:
    world = World()
    a, _ = world.replicas
    ticket = a.fleet.start(Decision("p0", True, False, "test", "setup"), prompt(adapter(1)))
    a.fleet.finish(ticket, Outcome.OK)
    before = kinds(a.outbox)
    a.fleet.first_token(ticket)
    assert kinds(a.outbox) == before == (EventKind.PUT, EventKind.LOADED, EventKind.RELEASE)


def test_a_loaded_for_an_unknown_request_is_ignored() -> None:
    world = World()
    _, b = world.replicas
    event = ResidencyEvent("r0", 1, "m", "p0", "uid-p0", EventKind.LOADED, 7)
    assert not b.fleet.apply_remote(event)
    assert b.fleet.prefix_index.pending_prefill_tokens("p0") == 0


def test_a_short_prompt_without_a_full_block_queues_nothing_remotely() -> None:
    world = World()
    a, b = world.replicas
    a.fleet.start(Decision("p0", True, False, "test", "setup"), RouteRequest("m", adapter(1), 16, 16))
    world.deliver()
    assert a.fleet.prefix_index.pending_prefill_tokens("p0") == 16  # the origin's own prompt
    assert b.fleet.prefix_index.pending_prefill_tokens("p0") == 0  # no block hashes: nothing to price it by
