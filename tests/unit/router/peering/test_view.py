"""The peer snapshot (export, import) and the demand summary, between replicas' fleets."""

from __future__ import annotations

import json

from trtfleet_router.models_registry import ModelRegistry
from trtfleet_router.peering.view import demand_summary, export_view, import_view
from trtfleet_router.routing import AdapterRef, Decision, Outcome, RouteRequest
from trtfleet_router.routing.events import STREAM_VERSION, decode_event
from trtfleet_router.routing.prefix import token_block_hashes

from tests.unit.router.peering.support import Replica


def test_a_snapshot_carries_lru_order_and_pins_per_origin() -> None:
    a, b, c = Replica("a"), Replica("b"), Replica("c")
    for task_id in (1, 2, 3):
        a.fleet.finish(a.start("p0", task_id), Outcome.OK)
    a_pin = a.start("p0", 2)
    b_pin = b.start("p1", 7)
    b.deliver_to(a)
    snapshot = json.loads(json.dumps(export_view({"m": a.fleet}, "a", a.journal.seq, {"b": b.journal.seq}, {})))
    assert snapshot["fleets"]["m"]["pods"][0]["resident"] == [[1, 1], [3, 1], [2, 1]]
    assert snapshot["fleets"]["m"]["tickets"] == {"a": [[a_pin.ticket_id, "p0", 2, False]], "b": [[1, "p1", 7, True]]}
    import_view({"m": c.fleet}, snapshot)
    assert list(c.fleet.residency.pod("p0").cache.resident()) == [1, 3, 2]
    assert set(c.fleet.residency.pod("p1").cache.host.busy) == {7}
    assert c.fleet.inflight_total() == 2
    b.fleet.finish(b_pin, Outcome.OK)  # c follows b from the snapshot's watermark: b's release unpins it
    b.journal.flush()
    for line in b.journal.after(snapshot["watermarks"]["b"])[1]:
        c.fleet.apply_remote(decode_event("b", line))
    assert set(c.fleet.residency.pod("p1").cache.host.busy) == set()
    assert c.fleet.forget_origin("a") == 1  # a gone: its pin on p0 goes too
    assert set(c.fleet.residency.pod("p0").cache.host.busy) == set()
    c.fleet.check_invariants()
    a.fleet.finish(a_pin, Outcome.OK)


def test_a_snapshot_carries_prefix_blocks_and_queued_prefill_so_a_late_replica_prices_them() -> None:
    a, b, c = Replica("a"), Replica("b"), Replica("c")
    adapter = AdapterRef("a5", 5, 1, 1)
    talk = token_block_hashes(list(range(640)), 5, 32)  # a conversation's 20 blocks, served on p1
    a.fleet.finish(a.fleet.start(Decision("p1", True, False, "t", "t"), RouteRequest("m", adapter, 640, 1,
                                                                                     blocks=talk)), Outcome.OK)
    a.fleet.prefix_index.set_confidence("p1", 0.5)
    base = Decision("p0", False, True, "t", "t")
    first, second = token_block_hashes(range(9000, 13096), 0, 32), token_block_hashes(range(20000, 22048), 0, 32)
    long_a = a.fleet.start(base, RouteRequest("m", None, 4096, 1, blocks=first))
    long_b = b.fleet.start(base, RouteRequest("m", None, 2048, 1, blocks=second))
    b.deliver_to(a)
    assert a.fleet.prefix_index.pending_prefill_tokens("p0") == 4096 + 2048
    snapshot = json.loads(json.dumps(export_view({"m": a.fleet}, "a", a.journal.seq, {"b": b.journal.seq}, {})))
    assert snapshot["fleets"]["m"]["prefill"] == {"a": [[long_a.ticket_id, 4096]], "b": [[long_b.ticket_id, 2048]]}
    import_view({"m": c.fleet}, snapshot)
    index = c.fleet.prefix_index
    assert index.match(talk.hashes) == {"p1": 20}  # the conversation's next turn is priced warm on p1 at once
    assert index.confidence("p1") == 0.5
    assert index.pending_prefill_tokens("p0") == 4096 + 2048  # the queue ahead on p0, as a and b see it
    a.fleet.first_token(long_a)  # a's loaded and b's release end them in c's view too
    b.fleet.finish(long_b, Outcome.OK)
    for replica, since in ((a, snapshot["seq"]), (b, snapshot["watermarks"]["b"])):
        replica.journal.flush()
        for line in replica.journal.after(since)[1]:
            c.fleet.apply_remote(decode_event(replica.journal.replica_id, line))
    assert index.pending_prefill_tokens("p0") == 0
    c.fleet.check_invariants()
    a.fleet.finish(long_a, Outcome.OK)


def test_a_snapshot_of_an_earlier_version_without_prefix_keys_still_imports() -> None:
    a, c = Replica("a"), Replica("c")
    a.fleet.finish(a.start("p0", 1), Outcome.OK)
    snapshot = export_view({"m": a.fleet}, "a", a.journal.seq, {}, {})
    for pod in snapshot["fleets"]["m"]["pods"]:
        del pod["blocks"], pod["confidence"]
    del snapshot["fleets"]["m"]["prefill"], snapshot["fleets"]["m"]["batch"]
    assert import_view({"m": c.fleet}, snapshot) == 1
    assert c.fleet.prefix_index.blocks_held("p0") == 0


def test_a_snapshot_names_the_batch_lines_so_a_late_replica_leaves_them_out_of_interactive_load() -> None:
    a, b, c = Replica("a"), Replica("b"), Replica("c")
    line = RouteRequest("m", None, 1, 1, background=True)
    a_line = a.fleet.start(Decision("p0", False, True, "t", "t"), line)
    a_chat = a.fleet.start(Decision("p0", False, True, "t", "t"), RouteRequest("m", None, 1, 1))
    b_line = b.fleet.start(Decision("p1", False, True, "t", "t"), line)
    b.deliver_to(a)
    snapshot = json.loads(json.dumps(export_view({"m": a.fleet}, "a", a.journal.seq, {"b": b.journal.seq}, {})))
    assert snapshot["fleets"]["m"]["batch"] == {"a": [a_line.ticket_id], "b": [b_line.ticket_id]}
    import_view({"m": c.fleet}, snapshot)
    loads = {pod: c.fleet.pods[pod].load for pod in ("p0", "p1")}
    assert [(load.remote_inflight, load.remote_background) for load in loads.values()] == [(2, 1), (1, 1)]
    assert [load.foreground(100.0) for load in loads.values()] == [1, 0]
    c.fleet.check_invariants()
    for replica, ticket in ((a, a_line), (a, a_chat), (b, b_line)):
        replica.fleet.finish(ticket, Outcome.OK)
    for replica, since in ((a, snapshot["seq"]), (b, snapshot["watermarks"]["b"])):
        replica.journal.flush()
        for event_line in replica.journal.after(since, STREAM_VERSION)[1]:
            c.fleet.apply_remote(decode_event(replica.journal.replica_id, event_line))
    assert [(load.remote_inflight, load.remote_background) for load in loads.values()] == [(0, 0), (0, 0)]
    c.fleet.check_invariants()


def test_demand_sums_every_replicas_requests() -> None:
    a, b = Replica("a"), Replica("b")
    a.start("p0", 1)
    b.start("p1", 1)
    b.start("p1", 2)
    b.deliver_to(a)
    summary = demand_summary({"m": a.fleet}, ModelRegistry(), "a", 100.0)
    base = summary["base_models"]["m"]
    assert base["inflight_requests"] == 3
    assert base["adapters_active"] == 2
    assert base["adapter_requests_per_s"] == {
        "1": round(2 / summary["window_s"], 4),
        "2": round(1 / summary["window_s"], 4),
    }
