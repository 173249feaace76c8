"""The picker's output-token meter over response body chunks (pure), for charging tenants as answers stream."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from trtfleet_router.epp.metering import ChunkMeter

EVENT = b'data: {"id":"c","object":"text_completion","choices":[{"index":0,"text":"x"}]}\n\n'
USAGE = b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":9,"total_tokens":12}}\n\n'


@dataclass(frozen=True)
class MeterCase:
    chunks: tuple[bytes, ...]
    added: tuple[int, ...]


def _split(data: bytes, at: int) -> tuple[bytes, bytes]:
    return data[:at], data[at:]


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(MeterCase((EVENT, EVENT * 2), (1, 2)), id="one token per streamed event"),
        pytest.param(MeterCase((*_split(EVENT, 52), EVENT), (0, 1, 1)), id="an event split across chunks counts once"),
        pytest.param(MeterCase((EVENT * 3, USAGE), (3, 6)), id="the stream's usage replaces the count"),
        pytest.param(MeterCase((EVENT * 3, USAGE.replace(b"9", b"2")), (3, 0)), id="never charged back"),
        pytest.param(
            MeterCase((b'{"choices":[{"text":"hello"}],"usage":{"completion_tokens": 5}}',), (5,)), id="a unary answer"
        ),
        pytest.param(MeterCase((b"", b"data: [DONE]\n\n"), (0, 0)), id="nothing to count"),
    ],
)
def test_meter(case: MeterCase) -> None:
    meter = ChunkMeter()
    assert tuple(meter.feed(chunk) for chunk in case.chunks) == case.added
    assert meter.counted == sum(case.added)
