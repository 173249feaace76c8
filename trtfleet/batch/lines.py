"""A batch's input lines, validated as OpenAI validates them, and its result lines (pure).

An input line is ``{"custom_id", "method": "POST", "url": <the batch's endpoint>, "body": {"model", ...}}``.
A line that breaks a rule becomes an error line (never a crash of the batch); the codes::

    invalid_json_line      not a JSON object
    invalid_custom_id      custom_id missing, not a string, empty or above 512 characters
    duplicate_custom_id    a custom_id already used by an earlier line of the file
    invalid_method         method other than POST
    invalid_url            url other than the batch's endpoint
    invalid_body           body missing or not an object, or body.model missing
    model_not_found        body.model is not served by the router

A result line (output and error files alike) is ``{"id", "custom_id", "response": {"status_code",
"request_id", "body"}, "error"}``: answered requests have a ``response`` (status 200 goes to the output
file, other statuses to the error file); lines that never reached a model have ``response: null`` and
``error: {"code", "message"}``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

CUSTOM_ID_MAX_CHARS: Final = 512


@dataclass(frozen=True, slots=True)
class BatchLine:
    """One valid input line: ``line`` is its 1-based line number in the input file."""

    line: int
    custom_id: str
    model: str
    body: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ParsedInput:
    lines: tuple[BatchLine, ...]
    rejected: tuple[dict[str, Any], ...]
    """Error lines for the invalid input lines, in input order."""

    @property
    def total(self) -> int:
        return len(self.lines) + len(self.rejected)


def result_id(batch_id: str, custom_id: str | None, line: int) -> str:
    """A stable id per result line (the same after a resume)."""
    digest = hashlib.sha256(f"{batch_id}\0{custom_id}\0{line}".encode()).hexdigest()[:24]
    return f"batch_req_{digest}"


def error_line(batch_id: str, custom_id: str | None, line: int, code: str, message: str) -> dict[str, Any]:
    return {
        "id": result_id(batch_id, custom_id, line),
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }


def response_line(
    batch_id: str, item: BatchLine, status_code: int, request_id: str, body: Mapping[str, Any]
) -> dict[str, Any]:
    return {
        "id": result_id(batch_id, item.custom_id, item.line),
        "custom_id": item.custom_id,
        "response": {"status_code": status_code, "request_id": request_id, "body": dict(body)},
        "error": None,
    }


def is_success(result: Mapping[str, Any]) -> bool:
    """Whether a result line belongs to the output file (else the error file)."""
    response = result.get("response")
    return result.get("error") is None and isinstance(response, dict) and response.get("status_code") == 200


def _check(raw: Any, endpoint: str, seen: set[str], serves: Callable[[str], bool]) -> tuple[str, str] | BatchLine:
    """``(code, message)`` for an invalid line, else the line (with ``line`` 0, set by the caller)."""
    if not isinstance(raw, dict):
        return "invalid_json_line", "the line is not a JSON object"
    custom_id = raw.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > CUSTOM_ID_MAX_CHARS:
        return "invalid_custom_id", f"custom_id must be a non-empty string of at most {CUSTOM_ID_MAX_CHARS} characters"
    if custom_id in seen:
        return "duplicate_custom_id", f"custom_id {custom_id!r} is a duplicate of an earlier line's"
    if raw.get("method") != "POST":
        return "invalid_method", f"method must be POST, not {raw.get('method')!r}"
    if raw.get("url") != endpoint:
        return "invalid_url", f"url {raw.get('url')!r} does not match the batch's endpoint {endpoint}"
    body = raw.get("body")
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        return "invalid_body", "body must be an object with a 'model' string"
    if not serves(body["model"]):
        return "model_not_found", f"the model {body['model']!r} does not exist or you do not have access to it"
    return BatchLine(0, custom_id, body["model"], body)


def parse_input(data: bytes, *, batch_id: str, endpoint: str, serves: Callable[[str], bool]) -> ParsedInput:
    """Every line of a JSONL input file, valid or rejected (blank lines are skipped, as OpenAI does)."""
    lines: list[BatchLine] = []
    rejected: list[dict[str, Any]] = []
    seen: set[str] = set()
    for number, text in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
        if not text.strip():
            continue
        try:
            raw = json.loads(text)
        except ValueError:
            raw = None
        checked = _check(raw, endpoint, seen, serves)
        custom_id = raw.get("custom_id") if isinstance(raw, dict) else None
        if isinstance(checked, BatchLine):
            seen.add(checked.custom_id)
            lines.append(BatchLine(number, checked.custom_id, checked.model, checked.body))
        else:
            code, message = checked
            cid = custom_id if isinstance(custom_id, str) else None
            rejected.append(error_line(batch_id, cid, number, code, f"line {number}: {message}"))
    return ParsedInput(tuple(lines), tuple(rejected))


def fill_default_model(data: bytes, model: str) -> bytes:
    """The input with ``model`` set in every line whose body is an object without one (a Batch resource's
    ``spec.model``); every other line is kept byte for byte, so validation still sees it as it was."""
    out = []
    for text in data.splitlines(keepends=True):
        try:
            raw = json.loads(text) if text.strip() else None
        except ValueError:
            raw = None
        body = raw.get("body") if isinstance(raw, dict) else None
        if isinstance(raw, dict) and isinstance(body, dict) and "model" not in body:
            raw["body"] = {"model": model, **body}
            ending = b"\n" if text.endswith(b"\n") else b""
            out.append(json.dumps(raw, ensure_ascii=False).encode() + ending)
        else:
            out.append(text)
    return b"".join(out)


def order_by_model(lines: Iterable[BatchLine]) -> list[BatchLine]:
    """Lines grouped by model (base model or adapter), groups in order of first appearance, input order
    within a group: each adapter's lines run together, so a pod loads each adapter once."""
    first_seen: dict[str, int] = {}
    for item in lines:
        first_seen.setdefault(item.model, len(first_seen))
    return sorted(lines, key=lambda item: (first_seen[item.model], item.line))


def order_results(results: Iterable[Mapping[str, Any]], lines: Sequence[BatchLine]) -> list[Mapping[str, Any]]:
    """Result lines in the input file's order (by custom_id; rejected lines without one keep their place
    at the end, in the order given)."""
    position = {item.custom_id: item.line for item in lines}
    indexed = list(enumerate(results))
    return [r for _, r in sorted(indexed, key=lambda p: (position.get(p[1].get("custom_id") or "", 1 << 62), p[0]))]
