"""A BaseModel that replaces another (``spec.serving.replaces``): names, fallbacks and the live choice."""

from __future__ import annotations

from dataclasses import replace

import pytest
from trtfleet_router.chat import chat_renderer
from trtfleet_router.liveview import DiscoverySnapshot, FleetSet, PodEndpoint
from trtfleet_router.models_registry import AdapterEntry, BaseModelEntry, EngineLimits, ModelRegistry
from trtfleet_router.routing.config import RoutingConfig


def _base(name: str, replaces: str | None = None) -> BaseModelEntry:
    entry = BaseModelEntry(name, "reference", EngineLimits(100, 150), chat_renderer("reference"))
    return replace(entry, replaces=replaces)


def _adapter(name: str, base: str, task_id: int) -> AdapterEntry:
    return AdapterEntry(name, base, task_id, f"/{base}/{name}")


def _route(registry: ModelRegistry, name: str) -> tuple[str, str | None]:
    """(base model of the target, base model of its fallback)."""
    target = registry.resolve(name)
    return target.base.name, target.fallback.base.name if target.fallback else None


OLD_NEW = [_base("old"), _base("new", replaces="old")]


@pytest.mark.parametrize(
    ("bases", "adapters", "name", "want"),
    [
        # the old name goes to the new base model first, the old one behind it
        (OLD_NEW, [], "old", ("new", "old")),
        (OLD_NEW, [], "new", ("new", None)),
        # an adapter on both, in either order: the successor's first
        (OLD_NEW, [_adapter("a", "old", 1), _adapter("a", "new", 9)], "a", ("new", "old")),
        (OLD_NEW, [_adapter("a", "new", 9), _adapter("a", "old", 1)], "a", ("new", "old")),
        # not recreated on the new base model yet: stays where it is
        (OLD_NEW, [_adapter("a", "old", 1)], "a", ("old", None)),
        (OLD_NEW, [_adapter("a", "new", 9)], "a", ("new", None)),
        # the old base model deleted: its name is an alias of the new one
        ([_base("new", replaces="old")], [], "old", ("new", None)),
        # unrelated base models with one adapter name: the later entry wins, no fallback (as before)
        ([_base("x"), _base("y")], [_adapter("a", "x", 1), _adapter("a", "y", 2)], "a", ("y", None)),
        # a base model cannot replace itself; a loop of two replaces nothing
        ([_base("x", replaces="x")], [], "x", ("x", None)),
        ([_base("x", replaces="y"), _base("y", replaces="x")], [], "x", ("x", None)),
        # two claim the same base model: the first by name takes it
        ([_base("old"), _base("b", replaces="old"), _base("a", replaces="old")], [], "old", ("a", "old")),
    ],
)
def test_names_during_a_migration(
    bases: list[BaseModelEntry], adapters: list[AdapterEntry], name: str, want: tuple[str, str | None]
) -> None:
    assert _route(ModelRegistry(bases, adapters), name) == want


def test_task_ids_of_both_sides_stay_known() -> None:
    registry = ModelRegistry(OLD_NEW, [_adapter("a", "old", 1), _adapter("a", "new", 9)])
    assert registry.adapter_by_task("old", 1).base_model == "old"  # requests already naming the old task id
    assert registry.adapter_by_task("new", 9).base_model == "new"
    assert [a.task_id for a in registry.adapters_of("old")] == [1]
    assert registry.aliases == {}
    assert ModelRegistry([_base("new", replaces="old")]).aliases == {"old": "new"}


def _pods(*names: str) -> dict[str, PodEndpoint]:
    return {n: PodEndpoint(n, f"{n}:1", n) for n in names}


@pytest.mark.parametrize(
    ("old_pods", "new_pods", "served_by"),
    [
        (["o1"], [], "old"),  # the new base model has no pod yet
        (["o1"], ["n1"], "new"),  # it has one: the move happens
        ([], ["n1"], "new"),
        ([], [], "new"),  # nobody can take it: the new one (its no-capacity answer, or a held request)
    ],
)
def test_the_side_with_ready_pods_serves(old_pods: list[str], new_pods: list[str], served_by: str) -> None:
    fleets = FleetSet(RoutingConfig(), seed=1)
    registry = ModelRegistry(OLD_NEW, [_adapter("a", "old", 1), _adapter("a", "new", 9)])
    fleets.apply(DiscoverySnapshot(registry, {"old": _pods(*old_pods), "new": _pods(*new_pods)}))
    assert fleets.serving(registry.resolve("old")).base.name == served_by
    assert fleets.serving(registry.resolve("a")).base.name == served_by
