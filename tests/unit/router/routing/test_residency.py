"""Shadow caches: the reverse index, eviction predictions, misses and suspects."""

from __future__ import annotations

from trtfleet_router.routing.residency import Residency


def test_put_acquire_release_and_reverse_index() -> None:
    residency = Residency()
    residency.reset_pod("a", host_pages=3, device_pages=1)
    residency.reset_pod("b", host_pages=3, device_pages=1)
    assert residency.put("a", 1, 2) and residency.put("b", 1, 2) and residency.put("a", 2, 1)
    assert residency.warm_pods(1) == {"a", "b"} and residency.warm_pods(2) == {"a"}
    pod = residency.pod("a")
    assert pod.has_free_pages(0) and not pod.has_free_pages(1)
    assert pod.would_evict(1) and pod.victims_for(1) == [1] and pod.victims_for(3) == [1, 2]
    assert residency.acquire("a", 1)
    assert pod.is_active(1) and not pod.is_active(2)
    assert pod.victims_for(2) is None and not pod.has_evictable_slot(2) and pod.has_evictable_slot(1)
    assert pod.victims_for(4) is None  # larger than the tier
    assert residency.put("a", 3, 1)  # evicts idle 2, not busy 1
    assert residency.warm_pods(2) == set() and residency.warm_pods(3) == {"a"}
    assert pod.evictions_total == 1
    residency.release("a", 1)
    residency.check_invariants()


def test_put_into_a_cache_of_busy_adapters_fails_without_side_effects() -> None:
    residency = Residency()
    residency.reset_pod("a", host_pages=1, device_pages=1)
    residency.put("a", 1, 1)
    residency.acquire("a", 1)
    assert not residency.put("a", 2, 1)
    assert not residency.acquire("a", 2)
    assert residency.warm_pods(2) == set()
    residency.check_invariants()


def test_mark_cold_idle_and_pinned() -> None:
    residency = Residency()
    residency.reset_pod("a", host_pages=4, device_pages=1)
    residency.put("a", 1, 1)
    residency.mark_cold("a", 1)
    assert not residency.is_warm("a", 1) and residency.warm_pods(1) == set()
    residency.put("a", 2, 1)
    residency.acquire("a", 2)
    residency.acquire("a", 2)
    residency.mark_cold("a", 2)
    assert not residency.is_warm("a", 2) and residency.warm_pods(2) == {"a"}  # suspect, still pinned
    residency.release("a", 2)
    assert residency.warm_pods(2) == {"a"}
    residency.release("a", 2)
    assert residency.warm_pods(2) == set()
    residency.mark_cold("a", 99)  # unknown id: nothing happens
    residency.mark_cold("gone", 1)  # unknown pod: nothing happens
    residency.check_invariants()


def test_reset_and_drop_pod_clear_the_index() -> None:
    residency = Residency()
    residency.reset_pod("a", host_pages=4, device_pages=1)
    residency.put("a", 1, 1)
    residency.reset_pod("a", host_pages=4, device_pages=1)
    assert residency.warm_pods(1) == set()
    residency.put("a", 2, 1)
    residency.drop_pod("a")
    assert residency.warm_pods(2) == set()
    residency.check_invariants()
