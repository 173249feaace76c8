"""bench.batch's pure parts: the batch input (deterministic, valid lines) and the table."""

from __future__ import annotations

import json

import pytest

from bench.batch import main, policy_config
from bench.batchapi import batch_input
from bench.batchreport import WARMUP_REQUESTS, medians, section, table, trace_summary
from bench.batchscenario import BatchScenario, batch_pods, expand_cases, parse_setting, setting_text
from trtfleet.batch.lines import parse_input


def test_batch_input_is_deterministic_and_valid() -> None:
    scenario = BatchScenario(lines=50, seed=3)
    data = batch_input(scenario, ["a", "b", "c"])
    assert data == batch_input(scenario, ["a", "b", "c"])
    parsed = parse_input(data, batch_id="b", endpoint="/v1/completions", serves=lambda m: m in "abc")
    assert len(parsed.lines) == 50 and not parsed.rejected
    assert {json.loads(line)["body"]["model"] for line in data.splitlines()} == {"a", "b", "c"}


def test_table_has_one_row_per_case() -> None:
    text = table([{"case": "batch grouped", "lines_per_s": 12.5, "ttft_p99_ms": float("nan")}])
    assert text.splitlines()[2].startswith("| batch grouped | 12.5 |")


def test_several_slot_values_give_one_interactive_batch_case_each() -> None:
    assert expand_cases(["interactive", "interactive+batch", "batch grouped"], {"slots": [6, 4]}) == [
        ("interactive", {"slots": 6}, "interactive"),
        ("interactive+batch", {"slots": 6}, "interactive+batch slots=6"),
        ("interactive+batch", {"slots": 4}, "interactive+batch slots=4"),
        ("batch grouped", {"slots": 6}, "batch grouped"),
    ]
    only = expand_cases(["interactive+batch"], {"slots": [4]})
    assert only == [("interactive+batch", {"slots": 4}, "interactive+batch")]


def test_several_lists_give_every_combination_naming_only_what_varies() -> None:
    runs = expand_cases(["interactive", "interactive+batch"], {"slots": [6], "conc": [24, 2], "reserve": [0]})
    assert runs == [
        ("interactive", {"slots": 6, "conc": 24, "reserve": 0}, "interactive"),
        ("interactive+batch", {"slots": 6, "conc": 24, "reserve": 0}, "interactive+batch conc=24"),
        ("interactive+batch", {"slots": 6, "conc": 2, "reserve": 0}, "interactive+batch conc=2"),
    ]
    combos = expand_cases(["interactive+batch"], {"slots": [6, 4], "conc": [8], "reserve": [0, 1]})
    assert [label for *_, label in combos] == [
        "interactive+batch slots=6 reserve=0", "interactive+batch slots=6 reserve=1",
        "interactive+batch slots=4 reserve=0", "interactive+batch slots=4 reserve=1",
    ]
    assert [(s["slots"], s["conc"], s["reserve"]) for _, s, _ in combos] == [(6, 8, 0), (6, 8, 1), (4, 8, 0), (4, 8, 1)]
    auto = parse_setting("reserve", "auto")
    assert [label for *_, label in expand_cases(["interactive+batch"], {"reserve": [2, auto]})] == [
        "interactive+batch reserve=2", "interactive+batch reserve=auto"]
    assert setting_text("reserve", auto) == "auto" and setting_text("slots", 6) == "6"
    with pytest.raises(ValueError):
        parse_setting("slots", "auto")  # only the reserve has an auto


def test_the_section_says_when_the_batch_was_cancelled_at_the_window_end() -> None:
    loads = ((0.0, 0.0, 0.0), (0.0, 0.0, 0.0))
    phrase = "cancelled when the interactive load ends"
    assert phrase in section(BatchScenario(cancel_after_interactive=True, min_step_ms=5.2), [], "cmd", loads)
    assert phrase not in section(BatchScenario(), [], "cmd", loads)
    assert "every step at least\n5.2 ms" in section(BatchScenario(min_step_ms=5.2), [], "cmd", loads)


def test_medians_are_per_case_over_the_rounds_with_each_rounds_p99() -> None:
    rounds = [
        [{"case": "interactive", "ttft_p99_ms": 90.0, "errors": 0},
         {"case": "interactive+batch", "ttft_p99_ms": 120.0, "lines_per_s": 40.0, "errors": 0}],
        [{"case": "interactive", "ttft_p99_ms": 200.0, "errors": 1},
         {"case": "interactive+batch", "ttft_p99_ms": 100.0, "lines_per_s": 44.0, "errors": 0}],
        [{"case": "interactive", "ttft_p99_ms": 95.0, "errors": 0},
         {"case": "interactive+batch", "ttft_p99_ms": 110.0, "lines_per_s": 42.0, "errors": 0}],
    ]
    rows = medians(rounds)
    assert [row["case"] for row in rows] == ["interactive", "interactive+batch"]
    assert rows[0]["ttft_p99_ms"] == 95.0 and rows[0]["errors"] == 0
    assert rows[0]["p99_per_round_ms"] == "90 / 200 / 95"
    assert rows[1]["ttft_p99_ms"] == 110.0 and rows[1]["lines_per_s"] == 42.0
    assert "p99_per_round_ms" in table(rows).splitlines()[0]
    assert "p99_pooled_ms" not in rows[0]  # rounds without their first answers: no pooled p99


def test_the_pooled_p99_is_over_every_rounds_requests() -> None:
    """Three rounds of 100 first answers each: one slow answer per round is 3 of 300, above the pooled p99's
    rank (the 297th), and the median of the rounds' own p99s would land on the slow answers."""
    rounds = [[{"case": "interactive", "ttft_p99_ms": 500.0, "ttfts_ms": [10.0] * 99 + [500.0]}] for _ in range(3)]
    row = medians(rounds)[0]
    assert row["ttft_p99_ms"] == 500.0
    assert row["p99_pooled_ms"] < 500.0
    assert "p99_pooled_ms" in table([row]).splitlines()[0]


def test_the_past_warmup_p99_leaves_each_rounds_first_requests_out() -> None:
    """A fresh fleet's first answers are slow in every case; past them the p99 is the steady tail."""
    ttfts = [90.0, 80.0, 70.0] + [12.0] * (WARMUP_REQUESTS - 3) + [10.0] * 89 + [30.0]
    rounds = [[{"case": "interactive", "ttft_p99_ms": 80.0, "ttft_p99_past_warmup_ms": 29.0, "ttfts_ms": ttfts}]
              for _ in range(3)]
    row = medians(rounds)[0]
    assert row["p99_pooled_ms"] >= 70.0  # 9 slow of 300: the warm-up sets the plain p99
    # 270 answers past warm-up, 3 of them 30 ms: rank 266.31 lies between a 10 and a 30
    assert row["p99_past_warmup_pooled_ms"] == pytest.approx(16.2)
    assert row["ttft_p99_past_warmup_ms"] == 29.0
    header = table([row]).splitlines()[0]
    assert "ttft_p99_past_warmup_ms" in header and "p99_past_warmup_pooled_ms" in header


def _done(priority: str, weights: bool, decided: float, first: float | None, load: int = 1) -> str:
    ctx = {"priority": priority, "send_weights": weights, "decided_ms": decided, "first_answer_ms": first,
           "pod_load": load}
    return json.dumps({"level": "debug", "msg": "upstream done", **ctx})


def test_trace_summary_counts_interactive_requests_only() -> None:
    lines = [
        _done("interactive", False, 0.1, 12.0),
        _done("interactive", True, 2.5, 180.0),
        _done("batch", True, 900.0, 400.0),  # batch lines are not counted
        _done("interactive", False, 0.2, None),  # answered nothing: no first answer to time
        '{"level": "info", "msg": "adapter weights loaded"}',
    ]
    summary = trace_summary(lines)
    assert {key: summary[key] for key in list(summary)[:5]} == {
        "interactive_warm": 1,
        "interactive_cold": 1,
        "decision_wait_max_ms": 2.5,
        "first_answer_p99_ms_warm": 12.0,
        "first_answer_p99_ms_cold": 180.0,
    }
    assert summary["shared_pod_past_warmup"] == 0  # both were warm-up requests
    assert "interactive_cold" in table([{"case": "interactive", **summary}]).splitlines()[0]


def test_trace_summary_splits_requests_that_shared_their_pod_past_warmup() -> None:
    warmup = [_done("interactive", False, 0.1, 500.0, load=3) for _ in range(WARMUP_REQUESTS)]
    alone = [_done("interactive", True, 0.1, ms) for ms in (8.0, 9.0, 10.0)]
    shared = [_done("interactive", False, 0.1, ms, load=2) for ms in (18.0, 20.0)]
    summary = trace_summary([*warmup, *alone, _done("batch", False, 0.1, 30.0, load=5), *shared])
    assert summary["shared_pod_past_warmup"] == 2
    assert summary["first_answer_p50_ms_alone"] == 9.0
    assert summary["first_answer_p99_ms_alone"] == 10.0
    assert summary["first_answer_p50_ms_shared"] == 19.0
    assert summary["first_answer_p99_ms_shared"] == 20.0


def test_trtfleet_settings_reach_the_routers_policy_section_and_bad_flags_are_refused() -> None:
    assert policy_config(BatchScenario()) is None
    scenario = BatchScenario(trtfleet=(("loadOverheadS", 0.0016), ("inflightDelayS", 0.01)))
    assert policy_config(scenario) == {"ttft_cost": {"loadOverheadS": 0.0016, "inflightDelayS": 0.01}}
    with pytest.raises(SystemExit):
        main(["--trtfleet", "loadOverheadS"])  # no value: the parser refuses it
    with pytest.raises(SystemExit):
        main(["--workers", "0"])


def test_the_niced_pods_are_those_the_routers_reserve_leaves_to_the_batch() -> None:
    from trtfleet_router.routing.hashing import rendezvous_rank
    from trtfleet_router.routing.reserve import RESERVE_KEY

    ranking = rendezvous_rank(RESERVE_KEY, ("w0", "w1", "w2", "w3", "w4", "w5"))
    assert batch_pods(6, 4) == sorted(ranking[4:])
    assert batch_pods(3, 2) == sorted(rendezvous_rank(RESERVE_KEY, ("w0", "w1", "w2"))[2:])
    assert len(batch_pods(3, 5)) == 1  # a reserve keeps at least one pod for the batch
    assert batch_pods(3, 0) == ["w0", "w1", "w2"]


def test_nice_values_make_one_case_each_and_stay_in_range() -> None:
    runs = expand_cases(["interactive", "interactive+batch"], {"reserve": [2], "nice": [0, 19]})
    assert [label for _, _, label in runs] == ["interactive", "interactive+batch nice=0", "interactive+batch nice=19"]
    for bad in ("20", "-1"):
        with pytest.raises(SystemExit):
            main(["--batch-pods-nice", bad])


def test_the_table_shows_the_size_an_auto_reserve_held() -> None:
    header, _, row = table([{"case": "interactive+batch reserve=auto", "reserved_pods": 4.0}]).splitlines()
    assert header.endswith("| reserved_pods |") and row.endswith("| 4 |")
    assert "reserved_pods" not in table([{"case": "interactive"}])


def test_nice_without_a_fixed_reserve_is_refused_rather_than_ignored() -> None:
    for reserve in ("0", "auto", "2,0"):
        with pytest.raises(SystemExit):
            main(["--batch-pods-nice", "19", "--batch-reserve-pods", reserve])


def test_medians_print_without_their_binary_tails() -> None:
    medians_row = table([{"case": "x", "lines_per_s": 46.650000000000006, "fleet_cores": 1.795, "errors": 0.0}])
    assert medians_row.splitlines()[2] == "| x | 46.65 |  |  |  |  | 0 |  | 1.795 |"
