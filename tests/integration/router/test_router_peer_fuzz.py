"""Fuzzing a real router's peer port (hypothesis, derandomized; :mod:`tests.support.portfuzz`): two ``trtfleet
router`` processes that follow each other with their token, and requests from anyone (no, wrong or odd
credentials, or the token) with hostile parameters, methods and paths, then bytes no HTTP client sends.

The router never answers 5xx and never stops; a request without the token is refused (401) on every peer
route; and since no request here advertises a URL a router could subscribe to, none may change the router's
membership or view: both are read with the token after every request. The pods of the fleet file are addresses
nothing listens on, so nothing else moves the view while the fuzz runs.
"""

from __future__ import annotations

import http.client
import json
import math
import socket
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from trtfleet_router.peering.peers import normalize_peer_url

from tests.integration.router.replica_process import RouterProcess, new_token_file, wait_for
from tests.support.portfuzz import (
    FUZZ,
    check_rejected_changes_nothing,
    credentials,
    query_params,
    raw_garbage,
    raw_request,
)

pytestmark = pytest.mark.integration

ROUTES = ("/fleet/v1/events", "/fleet/v1/snapshot", "/fleet/v1/demand", "/fleet/v1/held")
PARAMS = ("since", "replica", "advertise", "origin", "version", "base_model", "after", "wait", "above")


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RouterProcess, RouterProcess]]:
    from trtfleet_engines.reference.repository import default_reference_spec

    root = tmp_path_factory.mktemp("peer-fuzz")
    spec = default_reference_spec().model_dump(mode="json", by_alias=True, exclude_none=True)
    backends = [{"address": f"127.0.0.1:{_closed_port()}", "podId": f"w{i}"} for i in range(2)]
    fleet = {"baseModels": [{"name": "tiny", "spec": spec, "hostPages": 2, "devicePages": 2, "backends": backends}]}
    fleet_file = root / "fleet.yaml"
    fleet_file.write_text(yaml.safe_dump(fleet, sort_keys=False))
    token_file = new_token_file(root / "tokens")
    a = RouterProcess(fleet_file, root / "a.log", (), token_file=token_file)
    b = RouterProcess(fleet_file, root / "b.log", (a.peer_url,), token_file=token_file)
    try:
        wait_for(lambda: b.snapshot()["replica"] in a.snapshot()["watermarks"], "A follows B")
        yield a, b
    finally:
        b.stop()
        a.stop()
    assert a.process.returncode == 0 and b.process.returncode == 0  # both still ran, and stopped cleanly


def _state(router: RouterProcess) -> dict[str, Any]:
    snapshot = router.snapshot()
    return {key: snapshot[key] for key in ("peers", "watermarks", "seq", "fleets")}


def _tame(params: dict[str, str], path: str) -> dict[str, str]:
    """No URL a router could subscribe to (the fuzz checks that nothing changes), and no long poll."""
    if "advertise" in params:
        try:
            normalize_peer_url(params["advertise"])
            params["advertise"] = "ftp:" + params["advertise"]
        except ValueError:
            pass
    if path == "/fleet/v1/held" and "wait" in params:
        try:
            if math.isfinite(float(params["wait"])) and float(params["wait"]) > 0:
                params["wait"] = "0.01"
        except ValueError:
            pass
    return params


def _send(port: int, method: str, target: str, headers: dict[str, str]) -> int:
    """One request; a long-lived stream's answer is read up to its first line."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(method, target, headers=headers)
        response = connection.getresponse()
        if response.status == 200 and response.getheader("Content-Type", "").startswith("application/x-ndjson"):
            json.loads(response.fp.readline())  # the stream's header, then we hang up
        else:
            response.read()
        return response.status
    finally:
        connection.close()


@FUZZ
@given(
    data=st.data(),
    path=st.sampled_from([*ROUTES, "/fleet/v1/nope", "/", "/fleet/v1/events/../snapshot", "/FLEET/V1/SNAPSHOT"]),
    method=st.sampled_from(["GET", "GET", "GET", "HEAD", "POST", "DELETE", "OPTIONS"]),
)
def test_requests_from_anyone_change_nothing(pair: tuple[RouterProcess, RouterProcess], data: st.DataObject,
                                             path: str, method: str) -> None:
    a, _ = pair
    token = a.token
    assert token is not None
    headers, extra, authorized = data.draw(credentials(token))
    params = _tame({**data.draw(query_params(PARAMS)), **extra}, path)
    target = path + ("?" + urllib.parse.urlencode(params) if params else "")
    before = _state(a)
    status = _send(a.ports["peer"], method, target, headers)
    if not authorized and method in ("GET", "HEAD") and path in ROUTES:
        assert status in (401, 400, 414, 431), (status, target[:200])  # 4xx: a request line or header too long
    check_rejected_changes_nothing(status, before, lambda: _state(a))
    if status < 400:
        assert _state(a) == before  # nothing here could subscribe the router or feed it events


@FUZZ
@given(raw=raw_garbage)
def test_bytes_no_http_client_sends_change_nothing(pair: tuple[RouterProcess, RouterProcess], raw: bytes) -> None:
    a, _ = pair
    before = _state(a)
    status = raw_request("127.0.0.1", a.ports["peer"], raw)
    assert status is None or 400 <= status < 500, status
    assert _state(a) == before
    assert a.process.poll() is None
