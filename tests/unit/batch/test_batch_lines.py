"""Input-line validation (one case per rule), model grouping and the result-line shapes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from trtfleet.batch.lines import (
    BatchLine,
    fill_default_model,
    is_success,
    order_by_model,
    parse_input,
    response_line,
)

ENDPOINT = "/v1/completions"


def _line(custom_id: Any = "a", method: Any = "POST", url: Any = ENDPOINT, model: Any = "tiny") -> str:
    return json.dumps({"custom_id": custom_id, "method": method, "url": url, "body": {"model": model, "prompt": "x"}})


@dataclass(frozen=True)
class Case:
    text: str
    code: str | None


CASES = [
    pytest.param(Case(_line(), None), id="valid"),
    pytest.param(Case("{not json", "invalid_json_line"), id="not-json"),
    pytest.param(Case("[1, 2]", "invalid_json_line"), id="not-object"),
    pytest.param(Case(_line(custom_id=""), "invalid_custom_id"), id="empty-custom-id"),
    pytest.param(Case(_line(custom_id=7), "invalid_custom_id"), id="custom-id-not-string"),
    pytest.param(Case(_line(method="GET"), "invalid_method"), id="method"),
    pytest.param(Case(_line(url="/v1/chat/completions"), "invalid_url"), id="url"),
    pytest.param(Case(json.dumps({"custom_id": "a", "method": "POST", "url": ENDPOINT}), "invalid_body"), id="no-body"),
    pytest.param(Case(_line(model=3), "invalid_body"), id="model-not-string"),
    pytest.param(Case(_line(model="unknown"), "model_not_found"), id="unknown-model"),
]


@pytest.mark.parametrize("case", CASES)
def test_each_rule_gives_its_code(case: Case) -> None:
    parsed = parse_input(case.text.encode(), batch_id="b", endpoint=ENDPOINT, serves=lambda m: m == "tiny")
    assert parsed.total == 1
    if case.code is None:
        assert [i.custom_id for i in parsed.lines] == ["a"] and parsed.rejected == ()
    else:
        assert parsed.lines == ()
        (row,) = parsed.rejected
        assert row["response"] is None and row["error"]["code"] == case.code and "line 1" in row["error"]["message"]
        assert not is_success(row)


def test_duplicates_blank_lines_and_line_numbers() -> None:
    text = "\n".join([_line("a"), "", _line("b"), _line("a"), "  "]).encode()
    parsed = parse_input(text, batch_id="b", endpoint=ENDPOINT, serves=lambda m: True)
    assert [(i.line, i.custom_id) for i in parsed.lines] == [(1, "a"), (3, "b")]
    (dup,) = parsed.rejected
    assert dup["custom_id"] == "a" and dup["error"]["code"] == "duplicate_custom_id"
    assert dup["id"] != parsed.lines[0].custom_id and parsed.total == 3


def test_lines_are_grouped_by_model_in_first_appearance_order() -> None:
    models = ["x", "y", "x", "z", "y", "x"]
    lines = [BatchLine(n, f"c{n}", m, {"model": m}) for n, m in enumerate(models, start=1)]
    assert [(i.model, i.line) for i in order_by_model(lines)] == [
        ("x", 1),
        ("x", 3),
        ("x", 6),
        ("y", 2),
        ("y", 5),
        ("z", 4),
    ]


def test_response_lines_have_openais_shape() -> None:
    item = BatchLine(1, "c1", "tiny", {"model": "tiny"})
    ok = response_line("b", item, 200, "r1", {"choices": []})
    assert set(ok) == {"id", "custom_id", "response", "error"} and ok["error"] is None
    assert ok["response"] == {"status_code": 200, "request_id": "r1", "body": {"choices": []}} and is_success(ok)
    assert not is_success(response_line("b", item, 400, "r1", {"error": {}}))
    assert ok["id"] == response_line("b", item, 200, "other", {})["id"]  # stable across a resume


def test_a_default_model_fills_only_bodies_without_one() -> None:
    text = b'{"custom_id": "a", "body": {"prompt": "x"}}\n{"custom_id": "b", "body": {"model": "m"}}\n{broken\n'
    filled = fill_default_model(text, "tiny").splitlines()
    assert json.loads(filled[0])["body"] == {"model": "tiny", "prompt": "x"}
    assert filled[1:] == text.splitlines()[1:]
