"""The labels the operator puts on serving objects and the router selects by: the contract between them.

Serving pods, Services and so EndpointSlices carry ``trtfleet.io/basemodel=<label_value(BaseModel name)>``
and ``trtfleet.io/role`` (``base``, ``merged`` or ``variant``); a merged Adapter's add
``trtfleet.io/adapter=<label_value(Adapter name)>``, a QLoRA base variant's ``trtfleet.io/variant=<its name>``.
Object names may be longer than a label value may be (63 characters) or hold characters it may not:
:func:`label_value` maps each name to a valid value, stably, and both sides must use it (the router looks a
name up by its label value, never by the name itself).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Final

LABEL_BASEMODEL: Final = "trtfleet.io/basemodel"
LABEL_ADAPTER: Final = "trtfleet.io/adapter"
LABEL_ROLE: Final = "trtfleet.io/role"
ROLE_BASE: Final = "base"
ROLE_MERGED: Final = "merged"
ROLE_VARIANT: Final = "variant"
LABEL_VARIANT: Final = "trtfleet.io/variant"

LABEL_VALUE_MAX: Final = 63
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


def digest(value: Any, length: int = 64) -> str:
    """sha256 hex of ``value``'s canonical JSON (sorted keys), cut to ``length`` characters."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def label_value(value: str) -> str:
    """``value`` if it is a valid label value, else a valid label value derived from it (stable): the first
    characters that fit, made valid, then ``-`` and 8 hex digits of its digest."""
    if len(value) <= LABEL_VALUE_MAX and _LABEL_VALUE.match(value):
        return value
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "-", value)[: LABEL_VALUE_MAX - 9].strip("-_.")
    return f"{cleaned}-{digest(value, 8)}" if cleaned else digest(value, 16)
