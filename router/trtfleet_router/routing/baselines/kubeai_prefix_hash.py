"""``kubeai-prefix-hash``: KubeAI's ``PrefixHash`` with the prompt prefix in the key (a baseline).

Source: kubeai ``internal/loadbalancer/group.go`` (substratusai/kubeai@56aac4bc9e2200bbc65c5287fa0b3eb93ac5eadf)
and its docs ("Prefix Hash": adapter + the first ``prefixCharLength`` = 100 characters of the prompt hashed
onto a CHWBL ring, ``meanLoadPercentage`` 125). The ring and the bound are :mod:`.chwbl`'s; only the key
differs: the adapter's name plus the request's first KV block hash. The routing core sees block hashes,
not text; a first block is 32 tokens, about 128 characters (``routing/prefix.py``), so it stands for
KubeAI's 100 characters (requests that share their first block share KubeAI's key too, unless they differ
between characters 100 and 128). A prompt shorter than one block hashes the adapter alone.
"""

from __future__ import annotations

from trtfleet_router.routing.baselines.chwbl import BoundedLoadRingPicker, ChwblConfig
from trtfleet_router.routing.config import RoutingConfig
from trtfleet_router.routing.framework import Profile, RoutingContext

SECTION = "kubeai_prefix_hash"
NAME = "kubeai-prefix-hash"


class PrefixRingPicker(BoundedLoadRingPicker):
    name = "bounded-load-ring-prefix"

    def key(self, ctx: RoutingContext) -> str:
        adapter = ctx.request.adapter
        name = "" if adapter is None else adapter.name
        hashes = ctx.request.blocks.hashes
        return f"{name}/{hashes[0]:016x}" if hashes else name


def build(config: RoutingConfig) -> Profile:
    ring = config.section(SECTION, ChwblConfig)
    return Profile(
        NAME,
        picker=PrefixRingPicker(ring.load_factor, ring.virtual_nodes),
        retry_after_s=config.no_capacity_retry_after_s,
        uses_prefix=True,
    )
