"""``trtfleet demo --autoscale`` as a user runs it: the idle demo goes to zero workers, a burst of requests
arriving at zero is held by the router, workers start (the operator's decision function), every request
is answered, and the idle fleet goes back to zero; nothing is left running afterwards."""

from __future__ import annotations

import signal
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.integration.test_demo import (
    DEMO_TIMEOUT_S,
    STOP_TIMEOUT_S,
    check_answer,
    demo_argv,
    live_demo,
)
from tests.integration.test_demo import mark as mark  # the fixture
from tests.support.controlplane import eventually

pytestmark = pytest.mark.integration

BURST = 8
MODELS = ("tiny", "tiny-upper", "tiny-reverse", "tiny-json")


@pytest.mark.parametrize("runtime", ["pytorch", "tensorrtllm"])
def test_demo_autoscales_zero_to_n_to_zero_without_losing_a_request(mark: str, runtime: str) -> None:
    from openai import OpenAI

    argv = demo_argv("--workers", "1", "--autoscale", "2", "--autoscale-zero-after-s", "3", "--runtime", runtime)
    http_port = argv[argv.index("--http-port") + 1]
    with live_demo(argv, mark) as (proc, lines):
        def count(text: str) -> int:
            return sum(text in line for line in list(lines))

        eventually(lambda: proc.poll() is not None or count("autoscaler ScaledToZero") == 1,
                   timeout=DEMO_TIMEOUT_S, what="the idle demo to scale to zero workers")
        assert proc.poll() is None, "".join(lines)
        client = OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="unused", max_retries=0, timeout=300)

        def ask(index: int) -> tuple[str, str]:
            model = MODELS[index % len(MODELS)]
            return model, client.completions.create(model=model, prompt="hello world", max_tokens=48,
                                                    temperature=0).choices[0].text

        with ThreadPoolExecutor(max_workers=BURST) as pool:
            answers = list(pool.map(ask, range(BURST)))
        assert len(answers) == BURST
        for model, text in answers:
            check_answer(model, text)
        assert count("autoscaler ScaledFromZero") == 1, "".join(lines)
        eventually(lambda: count("autoscaler ScaledToZero") == 2, timeout=120,
                   what=f"the idle fleet back to zero:\n{''.join(lines[-5:])}")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(STOP_TIMEOUT_S) == 0, "".join(lines)
