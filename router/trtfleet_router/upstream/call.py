"""One request as the dispatcher takes it: who it is for, what it asks (one payload), and its limits."""

from __future__ import annotations

from dataclasses import dataclass

from trtfleet_router.models_registry import Target
from trtfleet_router.routing.prefix import NO_BLOCKS, PromptBlocks
from trtfleet_router.routing.tenancy import DEFAULT_TENANT
from trtfleet_router.routing.types import Decision
from trtfleet_router.upstream.payload import Payload
from trtfleet_router.upstream.waiting import Priority


@dataclass(slots=True)
class UpstreamCall:
    request_id: str
    target: Target
    payload: Payload  # what the pod is asked; each transport derives its wire form (see payload.py)
    prompt_tokens: int
    max_tokens: int
    deadline_s: float  # on time.monotonic()
    client_streaming: bool = False  # the client receives the answer as a stream
    client_id: str = ""  # the id answers carry back (a Triton client's request id)
    blocks: PromptBlocks = NO_BLOCKS  # the prompt's KV block hashes, computed once by the front end
    priority: Priority = Priority.INTERACTIVE  # its band where requests wait (see admission.py)
    tenant: str = DEFAULT_TENANT  # whose share of the fleet it uses (routing/tenancy.py)
    output_metered: bool = True  # the text layer charges its output as it streams; raw tensor calls pay max_tokens
    charged: bool = False  # its tenant paid for its prompt (at its first decision; retries do not pay again)
    pinned_decision: Decision | None = None  # prewarming: this pod, with weights, no retry elsewhere
