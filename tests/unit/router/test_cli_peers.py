"""``trtfleet router``'s peer flags: what they become, and clear errors for what cannot work."""

from __future__ import annotations

import argparse

import pytest
from trtfleet_router.cli import configure, settings_from_args
from trtfleet_router.peering.peers import PEER_PORT_DEFAULT, PeerSettings


def _settings(*argv: str) -> PeerSettings | None:
    parser = argparse.ArgumentParser()
    configure(parser)
    return settings_from_args(parser.parse_args(["--fleet-config", "f.yaml", *argv])).peering


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        pytest.param((), PeerSettings(port=PEER_PORT_DEFAULT), id="default: the peer port alone"),
        pytest.param(("--peer-port", "-1"), None, id="off"),
        pytest.param(
            ("--peer-port", "9001", "--peer", "http://127.0.0.1:9002", "--peer", "http://127.0.0.1:9003"),
            PeerSettings(port=9001, seeds=("http://127.0.0.1:9002", "http://127.0.0.1:9003")),
            id="the replicas benchmark's flags",
        ),
        pytest.param(
            ("--peer-dns", "r-peers.ns.svc:8082", "--peer-advertise", "http://10.0.0.1:8082", "--peer-grace-s", "3"),
            PeerSettings(dns="r-peers.ns.svc:8082", advertise_url="http://10.0.0.1:8082", grace_s=3.0),
            id="the chart's flags",
        ),
    ],
)
def test_peer_flags(argv: tuple[str, ...], expected: PeerSettings | None) -> None:
    assert _settings(*argv) == expected


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(("--peer", "10.0.0.7:8082"), "a peer URL is", id="not a URL"),
        pytest.param(("--peer-advertise", "http://10.0.0.1:8082/peers"), "no path", id="an advertised URL with a path"),
        pytest.param(("--peer-port", "-1", "--peer", "http://a:1"), "need the peer port", id="peers without a port"),
    ],
)
def test_peer_flags_that_cannot_work_stop_the_start(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(SystemExit, match=message):
        _settings(*argv)
