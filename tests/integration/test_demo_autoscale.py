"""``trtfleet demo --autoscale`` as a user runs it: the idle demo goes to zero workers, a burst of requests
arriving at zero is held by the router, workers start (the operator's decision function), every request
is answered, and the idle fleet goes back to zero; nothing is left running afterwards."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.integration.test_demo import (
    DEMO_TIMEOUT_S,
    MARK_ENV,
    STOP_TIMEOUT_S,
    assert_nothing_left,
    check_answer,
    demo_argv,
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
    proc = subprocess.Popen(argv, env={**os.environ, MARK_ENV: mark}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()

    def count(text: str) -> int:
        return sum(text in line for line in list(lines))

    try:
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
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(10)
    assert_nothing_left(mark, "".join(lines))
