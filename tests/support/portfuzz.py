"""Fuzzing an internal HTTP port (the router's peer port now, the endpoint picker's when it lands): hypothesis
strategies for the requests a stranger or a broken peer sends, a raw-socket client for what no HTTP library
sends, and the invariant every test of such a port checks (a rejected request changes nothing).

* :func:`credentials` - no ``Authorization``, another scheme, a wrong token (of the right length too), the token
  itself in odd places (a query parameter, lower case), or the right one;
* :func:`query_params` - a port's known parameters with hostile values (huge, negative, not numbers, NaN,
  control characters, non-ASCII, URLs that are not peer URLs) plus unknown ones;
* :func:`stream_bodies` - NDJSON streams as a broken or hostile peer serves them: garbage headers, wrong
  versions, lines of the wrong shape, huge lines, bytes that are not UTF-8;
* :func:`raw_request` - one request written to a socket as given (a request line or headers beyond the
  server's limits, garbage bytes), answered with the status or None when the server closed the connection;
* :func:`check_rejected_changes_nothing` - the invariant, given how to read the port's state.

Settings: :data:`FUZZ` (derandomized, no example database, bounded), so a run is the same on every machine.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Sequence
from typing import Any, Final

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

FUZZ = settings(
    max_examples=150,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
HUGE_CHARS: Final = 70_000
"""Longer than any line or header limit of the servers under test (aiohttp: 8190 bytes per line)."""

hostile_text = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=20),
    st.sampled_from(["", " ", "\x00", "\r\nX-Injected: 1", "%00", "%ff", "../../etc", "\u202e", "🙂" * 5]),
    st.builds(lambda n: "9" * n, st.integers(4000, 5000)),  # past Python's int-from-string digit limit
)
numbers_as_text = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.sampled_from(["nan", "NaN", "inf", "-inf", "1e308", "1e-320", "0x10", "1_000", " 7 ", "+3", "-0", "07"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)
url_like = st.one_of(
    st.sampled_from([
        "http://127.0.0.1:1", "https://evil.example:443", "http://[::1]:8082", "file:///etc/passwd",
        "http://user:pw@10.0.0.7:8082", "http://10.0.0.7:8082/path?q=1#f", "gopher://x", "http://", "http://:80",
        "http://[::1", "http://10.0.0.7:99999", "javascript:alert(1)", "http://a b:1",
    ]),
    st.builds(lambda host, port: f"http://{host}:{port}", st.text(max_size=12), st.integers(-5, 70000)),
)


def query_params(known: Sequence[str]) -> st.SearchStrategy[dict[str, str]]:
    """Some of the ``known`` parameter names with hostile values, now and then an unknown name, or a huge
    value."""
    values = st.one_of(hostile_text, numbers_as_text, url_like)

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, str]:
        params = {name: draw(values) for name in known if draw(st.booleans())}
        if draw(st.integers(0, 4)) == 0:
            params.update(draw(st.dictionaries(st.text(min_size=1, max_size=8), values, max_size=2)))
        if draw(st.integers(0, 9)) == 0:
            params[draw(st.sampled_from([*known, "x"]) if known else st.just("x"))] = "a" * HUGE_CHARS
        return params

    return build()


def credentials(token: str) -> st.SearchStrategy[tuple[dict[str, str], dict[str, str], bool]]:
    """(headers, extra query parameters, whether they carry ``token`` as the port expects it)."""
    wrong = "x" * len(token)
    return st.sampled_from([
        ({}, {}, False),
        ({"Authorization": f"Bearer {wrong}"}, {}, False),
        ({"Authorization": f"Bearer {token[:-1]}"}, {}, False),
        ({"Authorization": f"Bearer {token}x"}, {}, False),
        ({"Authorization": f"Basic {token}"}, {}, False),
        ({"Authorization": token}, {}, False),
        ({"X-Api-Key": token}, {}, False),
        ({}, {"token": token, "access_token": token}, False),
        ({"Authorization": "Bearer " + "a" * 7000}, {}, False),
        ({"Authorization": f"Bearer {token}"}, {}, True),
    ])


def _event_line(pod: tuple[str, str, str]) -> st.SearchStrategy[bytes]:
    """One event line about ``pod`` (base model, pod id, uid): well formed now and then, mostly not."""
    base, pod_id, uid = pod
    fields = st.lists(st.one_of(st.integers(-(2**66), 2**66), st.text(max_size=8), st.none(), st.booleans(),
                                st.floats(allow_nan=True)), max_size=12)
    kinds = st.sampled_from(["put", "acquire", "loaded", "release", "mark_cold", "pod_reset", "nope", ""])
    well_formed = st.builds(lambda seq, kind, ticket, task, pages: json.dumps(
            [seq, base, pod_id, uid, kind, ticket, task, pages]).encode() + b"\n",
            st.integers(-3, 2**64), kinds, st.integers(-3, 2**40), st.one_of(st.none(), st.integers(-3, 2**40)),
            st.integers(-3, 2**40))
    malformed = st.one_of(
        fields.map(lambda row: json.dumps(row).encode() + b"\n"),
        st.just(json.dumps([1, base, pod_id, uid, "put", 1, 7, 1, "not base64!", "class"]).encode() + b"\n"),
        st.binary(max_size=30).map(lambda raw: raw.replace(b"\n", b"") + b"\n"),
        st.just(b"\n"),
    )
    return mostly(well_formed, malformed)


def mostly(usual: st.SearchStrategy[Any], rare: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``usual`` three times in four, else ``rare``: most examples get past the first check, the rest probe it."""

    @st.composite
    def pick(draw: st.DrawFn) -> Any:
        return draw(rare if draw(st.integers(0, 3)) == 0 else usual)

    return pick()


def stream_bodies(pod: tuple[str, str, str], replica: str = "fuzzpeer") -> st.SearchStrategy[bytes]:
    """A peer's ``/fleet/v1/events`` body: a header (well formed now and then) and event lines about ``pod``
    (base model, pod id, uid) or nothing sensible, some of them huge or not JSON at all."""
    good_header = {"replica": replica, "seq": 0, "since": 0, "gap": False, "version": 2}
    headers = mostly(st.just(json.dumps(good_header).encode()), st.one_of(
        st.fixed_dictionaries({}, optional={
            "replica": st.one_of(st.just(replica), hostile_text, st.integers()),
            "seq": st.one_of(st.integers(), numbers_as_text), "since": st.one_of(st.integers(), numbers_as_text),
            "gap": st.one_of(st.booleans(), st.integers(0, 1), st.none()),
            "version": st.one_of(st.integers(-2, 99), numbers_as_text),
        }).map(lambda header: json.dumps(header).encode()),
        st.binary(max_size=40).map(lambda raw: raw.replace(b"\n", b"")),
        st.just(b"[1, 2, 3]"),
        st.just(b"{" * 3000),
    ))

    @st.composite
    def build(draw: st.DrawFn) -> bytes:
        body = draw(headers) + b"\n"
        body += b"".join(draw(st.lists(_event_line(pod), max_size=6)))
        if draw(st.integers(0, 5)) == 0:
            body += b"[" + b"7," * (HUGE_CHARS * 2) + b"7]\n"  # one line past the reader's limit
        return body

    return build()


def raw_request(host: str, port: int, data: bytes, timeout_s: float = 5.0) -> int | None:
    """Write ``data`` to ``host:port`` as it is and read the answer's status (None: closed, or silent for
    ``timeout_s``, without one)."""
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        try:
            sock.sendall(data)
        except OSError:
            return None  # the server closed while the request was still being written
        head = b""
        try:
            while b"\r\n" not in head:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                head += chunk
        except OSError:
            return None
    parts = head.split(b" ", 2)
    return int(parts[1]) if head.startswith(b"HTTP/1.") and len(parts) > 1 and parts[1].isdigit() else None


raw_garbage = st.one_of(
    st.binary(max_size=200).map(lambda raw: raw + b"\r\n\r\n"),  # ended as a request head is: parsed, not awaited
    st.just(b"GET /" + b"a" * HUGE_CHARS + b" HTTP/1.1\r\nHost: x\r\n\r\n"),
    st.just(b"GET /fleet/v1/snapshot HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * HUGE_CHARS + b"\r\n\r\n"),
    st.just(b"GET /fleet/v1/snapshot HTTP/1.1\r\n" + b"".join(b"H%d: v\r\n" % i for i in range(500)) + b"\r\n"),
    st.just(b"GET /fleet/v1/events?since=0 HTTP/9.9\r\nHost: x\r\n\r\n"),
    st.just(b"POST /fleet/v1/events HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n" + b"z" * 1000),
    st.just(b"GET /fleet/v1/snapshot HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"),
    st.just(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(32)),  # a TLS ClientHello's first bytes
)


def check_rejected_changes_nothing(status: int, before: Any, read_state: Callable[[], Any]) -> Any:
    """The invariant of one fuzzed request: never a 5xx; a rejected one (4xx) leaves the state as ``before``.
    Returns the state to compare the next request with."""
    assert status < 500, f"the port answered {status}"
    after = read_state()
    if status >= 400:
        assert after == before, "a rejected request changed the port's state"
    return after
