"""Serialise CPython 3.11's traceback caret parsing across the test process's threads.

Python 3.11 underlines the failing expression in a formatted traceback by ``ast.parse``-ing the source line
(``traceback._extract_caret_anchors_from_line_segment``). The AST constructor keeps its recursion depth in
per-interpreter state, so two threads formatting tracebacks at once (or a finaliser that logs an exception
from inside another parse) can corrupt it and the parse raises ``SystemError: AST constructor recursion depth
mismatch`` (python/cpython#106905 and its neighbours). Integration tests run routers in threads of the test
process, and pytest's log handler re-raises a failure to format a record, so a router thread logging an
exception while another thread does the same turned a pod kill into a client-visible 500 once in CI.

A router in its own process logs through :mod:`logging`'s default handler, which reports a formatting error
on stderr and goes on; only the test process needs this. Carets are cosmetic: a nested or concurrent call
(a finaliser's log inside a parse) gets none."""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from typing import Any

_lock = threading.Lock()
_holder: list[int] = [0]  # the thread inside a parse, 0 when none


def serialise_caret_parsing() -> None:
    original: Callable[[str], Any] | None = getattr(traceback, "_extract_caret_anchors_from_line_segment", None)
    if original is None or getattr(original, "_trtfleet_serialised", False):
        return  # another Python (3.13 reworked it), or already installed

    def one_at_a_time(segment: str) -> Any:
        me = threading.get_ident()
        if _holder[0] == me:
            return None  # a finaliser logging from inside this thread's own parse: no carets this time
        with _lock:
            _holder[0] = me
            try:
                return original(segment)
            finally:
                _holder[0] = 0

    one_at_a_time._trtfleet_serialised = True  # type: ignore[attr-defined]
    traceback._extract_caret_anchors_from_line_segment = one_at_a_time  # type: ignore[attr-defined]
