"""Merge advice for one BaseModel's Adapters (pure): the routers' demand views + now -> status, events.

Each Adapter gets ``status.merge`` and the ``MergeRecommended`` condition from
:func:`trtfleet.mergedecision.decide` over its request rate: in every router view, the adapter's rate on its
base model's shared pool (``adapter_requests_per_s``, hot-swapped or as the merged pods' fallback) plus its
merged fleet's (``<served name>@merged``); the largest over the views, since peered replicas each see the
whole fleet (without peering it is a lower bound). No view at all: Unknown, memory kept.

``spec.mode: auto`` Adapters then act on it (``status.merge.mode``; the Adapter reconciler serves that
mode): those suggested dynamic switch back first, then those suggested merged, the busiest first, while the
BaseModel has fewer than ``maxMergedAdapters`` merged (explicit ``mode: merged`` ones count); none switches
twice within ``minDwellSeconds``. Every switch and every change of suggestion is an Event.

Cheap on the API server: the shell keeps each Adapter's :class:`~trtfleet.mergedecision.Memory` between
rounds (``memories``; the status is its checkpoint, read after a restart), so a round writes an Adapter's
status only when the advice, the mode, the clocks or the condition change, its share of a pod moved by
``FRACTION_STEP`` or more, or its checkpoint is older than ``CHECKPOINT_S``. A quiet long tail costs no
writes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from trtfleet.api import AdapterMode, BaseModelSpec, MergingSpec, Suggestion
from trtfleet.api.merging import MERGED_FLEET_SUFFIX
from trtfleet.mergedecision import Advice, Costs, Memory, decide, speculation_after_merge
from trtfleet_operator import conditions as cond
from trtfleet_operator.reconcile.engine import rfc3339
from trtfleet_operator.reconcile.types import Event, Obj

CONDITION_STATUS = {Suggestion.MERGED: cond.TRUE, Suggestion.DYNAMIC: cond.FALSE, Suggestion.UNKNOWN: cond.UNKNOWN}
SWITCHED_TO_MERGED = "SwitchedToMerged"
SWITCHED_TO_DYNAMIC = "SwitchedToDynamic"
FRACTION_STEP = 0.05
"""A change of the share of a pod worth writing (5 % of a pod)."""
CHECKPOINT_S = 600.0
"""The oldest ``status.merge.sampledAt`` left as it is: what a restarted operator resumes from."""
SIGNIFICANT = ("suggested", "decided", "mode", "switchedAt", "crossingSince", "observingSince")


@dataclass(frozen=True)
class AdapterAdvice:
    name: str
    status: Obj
    """The status fields to write, ``merge`` and ``conditions``; empty: nothing worth a write."""
    events: tuple[Event, ...]
    switched: bool
    memory: Memory
    """For the shell to pass back next round."""


def served_name(adapter: Obj) -> str:
    status, spec = adapter.get("status") or {}, adapter.get("spec") or {}
    return str(status.get("servedName") or spec.get("servedName") or adapter["metadata"]["name"])


def adapter_rate(views: Sequence[Mapping[str, Any]], base_model: str, served: str) -> float | None:
    """Requests/s of adapter ``served`` of ``base_model`` in the routers' demand views; None without views."""
    if not views:
        return None
    rates = []
    for view in views:
        bases = view.get("base_models") or {}
        shared = ((bases.get(base_model) or {}).get("adapter_requests_per_s") or {}).get(served, 0.0)
        merged = (bases.get(served + MERGED_FLEET_SUFFIX) or {}).get("base_requests_per_s", 0.0)
        rates.append(float(shared or 0.0) + float(merged or 0.0))
    return max(rates)


def _epoch(text: object) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _stamp(epoch_s: float | None) -> str | None:
    return None if epoch_s is None else rfc3339(datetime.fromtimestamp(epoch_s, UTC))


def _memory(merge: Mapping[str, Any]) -> Memory:
    decided = merge.get("decided")
    rate = merge.get("requestsPerSecond")
    return Memory(
        rate_per_s=float(rate) if isinstance(rate, int | float) else None,
        sampled_at_s=_epoch(merge.get("sampledAt")),
        observing_since_s=_epoch(merge.get("observingSince")),
        crossing_since_s=_epoch(merge.get("crossingSince")),
        decided=Suggestion(decided) if decided in (Suggestion.MERGED.value, Suggestion.DYNAMIC.value) else None,
    )


def _merge_status(advice: Advice, old: Mapping[str, Any]) -> Obj:
    memory = advice.memory
    fields: dict[str, Any] = {
        "suggested": advice.suggestion.value,
        "decided": memory.decided.value if memory.decided else None,
        "mode": old.get("mode"),
        "requestsPerSecond": None if memory.rate_per_s is None else round(memory.rate_per_s, 4),
        "podFraction": None if advice.pod_fraction is None else round(advice.pod_fraction, 4),
        "sampledAt": _stamp(memory.sampled_at_s),
        "observingSince": _stamp(memory.observing_since_s),
        "crossingSince": _stamp(memory.crossing_since_s),
        "switchedAt": old.get("switchedAt"),
    }
    return {k: v for k, v in fields.items() if v is not None}


def _mode(adapter: Obj) -> str:
    return str((adapter.get("spec") or {}).get("mode") or AdapterMode.DYNAMIC.value)


def _served_merged(adapter: Obj) -> bool:
    mode = _mode(adapter)
    chosen = ((adapter.get("status") or {}).get("merge") or {}).get("mode")
    return mode == AdapterMode.MERGED.value or (mode == AdapterMode.AUTO.value and chosen == AdapterMode.MERGED.value)


def _worth_writing(old: Mapping[str, Any], new: Mapping[str, Any], condition_changed: bool, now_s: float) -> bool:
    if condition_changed or any(old.get(k) != new.get(k) for k in SIGNIFICANT):
        return True
    before, after = old.get("podFraction"), new.get("podFraction")
    if (before is None) != (after is None):
        return True
    if isinstance(before, int | float) and isinstance(after, int | float) and abs(after - before) >= FRACTION_STEP:
        return True
    sampled = _epoch(old.get("sampledAt"))
    return sampled is None or now_s - sampled >= CHECKPOINT_S


def advise_basemodel(
    basemodel: Obj,
    adapters: Sequence[Obj],
    views: Sequence[Mapping[str, Any]],
    now: datetime,
    memories: Mapping[str, Memory] | None = None,
) -> list[AdapterAdvice]:
    """The advice for every live Adapter of ``basemodel`` (none when its spec is unreadable); ``memories``:
    the last round's, by Adapter uid (else each status's checkpoint)."""
    try:
        spec = BaseModelSpec.model_validate(basemodel.get("spec"))
    except ValidationError:
        return []  # the BaseModel reconcile reports it
    merging = spec.merging or MergingSpec()
    costs = Costs(
        pod_requests_per_s=merging.pod_requests_per_second,
        lora_step_overhead=merging.lora_step_overhead,
        merge_above=merging.merge_above_pod_fraction,
        unmerge_below=merging.unmerge_below_pod_fraction,
        sustain_s=float(merging.sustain_seconds),
        speculation=speculation_after_merge(spec.speculative),
    )
    base_name, now_s = basemodel["metadata"]["name"], now.timestamp()
    live = [a for a in adapters if not a["metadata"].get("deletionTimestamp")]
    advices: dict[str, Advice] = {}
    merges: dict[str, Obj] = {}
    for adapter in live:
        name = adapter["metadata"]["name"]
        old = (adapter.get("status") or {}).get("merge") or {}
        memory = (memories or {}).get(str(adapter["metadata"].get("uid"))) or _memory(old)
        advices[name] = decide(costs, memory, adapter_rate(views, base_name, served_name(adapter)), now_s)
        merges[name] = _merge_status(advices[name], old)
        if _mode(adapter) == AdapterMode.AUTO.value:
            merges[name].setdefault("mode", AdapterMode.DYNAMIC.value)
        else:  # a stale choice from mode auto days would show in the SERVING column
            merges[name].pop("mode", None)
    events: dict[str, list[Event]] = {a["metadata"]["name"]: [] for a in live}
    notes: dict[str, str] = {}
    _switch(live, advices, merges, events, notes, merging, now_s)
    out = []
    for adapter in live:
        name = adapter["metadata"]["name"]
        advice, status = advices[name], adapter.get("status") or {}
        message = advice.message + notes.get(name, "")
        generation = adapter["metadata"].get("generation")
        condition = cond.make(
            cond.MERGE_RECOMMENDED, CONDITION_STATUS[advice.suggestion], advice.reason.value, message,
            generation=generation,
        )
        others = [c for c in status.get("conditions") or [] if c.get("type") != cond.MERGE_RECOMMENDED]
        conditions = cond.merge(status.get("conditions"), [*others, condition], now=rfc3339(now))
        prior = cond.find(status.get("conditions"), cond.MERGE_RECOMMENDED) or {}
        condition_changed = (prior.get("status"), prior.get("reason")) != (condition["status"], condition["reason"])
        old_merge = status.get("merge") or {}
        if old_merge.get("suggested") != advice.suggestion.value and advice.suggestion is not Suggestion.UNKNOWN:
            events[name].insert(0, Event("Normal", f"{advice.suggestion.value}Recommended", message))
        switched = any(e.reason in (SWITCHED_TO_MERGED, SWITCHED_TO_DYNAMIC) for e in events[name])
        write = _worth_writing(old_merge, merges[name], condition_changed, now_s)
        status_fields = {"merge": merges[name], "conditions": conditions} if write else {}
        out.append(AdapterAdvice(name, status_fields, tuple(events[name]), switched, advice.memory))
    return out


def status_patch(old_status: Mapping[str, Any], fields: Mapping[str, Any]) -> Obj:
    """The JSON merge patch that turns ``old_status`` into one with ``fields``: ``merge`` key by key (a key
    the new value lacks is removed with null), ``conditions`` whole; {} if nothing changes."""
    patch: Obj = {}
    for key, value in fields.items():
        before = old_status.get(key)
        if key == "merge" and isinstance(value, Mapping):
            old_merge = before if isinstance(before, Mapping) else {}
            diff = {k: v for k, v in value.items() if old_merge.get(k) != v}
            diff |= {k: None for k in old_merge if k not in value}
            if diff:
                patch[key] = diff
        elif before != value:
            patch[key] = value
    return patch


def _switch(
    adapters: Sequence[Obj],
    advices: Mapping[str, Advice],
    merges: dict[str, Obj],
    events: dict[str, list[Event]],
    notes: dict[str, str],
    merging: MergingSpec,
    now_s: float,
) -> None:
    """``mode: auto``: switch on the advice, within the cap and the dwell time (mutates the three maps)."""
    merged = sum(1 for a in adapters if _served_merged(a))
    auto = [a["metadata"]["name"] for a in adapters if _mode(a) == AdapterMode.AUTO.value]

    def dwelt(name: str) -> bool:
        last = _epoch(merges[name].get("switchedAt"))
        return last is None or now_s - last >= merging.min_dwell_seconds

    def flip(name: str, mode: AdapterMode, reason: str) -> None:
        merges[name].update(mode=mode.value, switchedAt=_stamp(now_s))
        events[name].append(Event("Normal", reason, f"mode auto: now served {mode.value} ({advices[name].message})"))

    for name in auto:
        if merges[name]["mode"] == AdapterMode.MERGED.value and advices[name].suggestion is Suggestion.DYNAMIC:
            if dwelt(name):
                flip(name, AdapterMode.DYNAMIC, SWITCHED_TO_DYNAMIC)
                merged -= 1
            else:
                notes[name] = f"; mode auto: stays merged for minDwellSeconds {merging.min_dwell_seconds}"
    wanting = [n for n in auto if merges[n]["mode"] == AdapterMode.DYNAMIC.value
               and advices[n].suggestion is Suggestion.MERGED]
    for name in sorted(wanting, key=lambda n: (-(advices[n].pod_fraction or 0.0), n)):
        if not dwelt(name):
            notes[name] = f"; mode auto: stays dynamic for minDwellSeconds {merging.min_dwell_seconds}"
        elif merged >= merging.max_merged_adapters:
            notes[name] = f"; mode auto: stays dynamic, maxMergedAdapters {merging.max_merged_adapters} reached"
        else:
            flip(name, AdapterMode.MERGED, SWITCHED_TO_MERGED)
            merged += 1
