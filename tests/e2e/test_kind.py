"""trtfleet on a kind cluster: the chart's router in front of the operator's reference-engine pods,
driven with the ``openai`` client through ``kubectl port-forward``.

The cluster comes from ``hack/e2e-kind.sh up`` (kind, the images, ``helm install``, the reference
BaseModel and the sample Adapters, all Ready). ``make e2e-kind`` runs the script, which runs this file
with ``TRTFLEET_E2E_KUBECONFIG`` set; run alone (``pytest -m e2e``), the module fixture runs the script
itself and deletes the cluster afterwards. Without a Docker engine the test is skipped with the reason
(or fails, with ``TRTFLEET_E2E_REQUIRED=1``): it is never green without having run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.controlplane import eventually, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3600)]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "hack" / "e2e-kind.sh"
KUBECTL = Path(sys.executable).parent / "kubectl"
EXIT_MISSING = 3  # hack/e2e-kind.sh: a prerequisite is missing
PROMPT = "hello world"
MAX_TOKENS = 48


def docker_unavailable() -> str | None:
    """Why there is no usable Docker engine, or None."""
    try:
        res = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        return "no docker command"
    except subprocess.TimeoutExpired:
        return "docker info did not answer in 30 s"
    if res.returncode == 0:
        return None
    lines = [line.strip() for line in (res.stderr + res.stdout).splitlines()]
    reason = next((line for line in lines if re.search(r"cannot connect|error", line, re.I)), "failed")
    return f"docker info: {reason}"


def skip_or_fail(reason: str) -> None:
    message = f"no kind cluster possible, nothing was tested: {reason}"
    if os.environ.get("TRTFLEET_E2E_REQUIRED") == "1":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    given = os.environ.get("TRTFLEET_E2E_KUBECONFIG")
    if given:
        yield Path(given)
        return
    reason = docker_unavailable()
    if reason is not None:
        skip_or_fail(reason)
    state = tmp_path_factory.mktemp("e2e-kind")
    env = {**os.environ, "TRTFLEET_E2E_DIR": str(state)}
    up = subprocess.run(["bash", str(SCRIPT), "up"], env=env)
    try:
        if up.returncode == EXIT_MISSING:
            skip_or_fail("hack/e2e-kind.sh up: a prerequisite is missing (see its output)")
        assert up.returncode == 0, f"hack/e2e-kind.sh up failed ({up.returncode}); diagnostics in {state}/logs"
        yield state / "kubeconfig"
    finally:
        subprocess.run(["bash", str(SCRIPT), "down"], env=env, check=False)


@pytest.fixture(scope="module")
def router(kubeconfig: Path) -> Iterator[tuple[str, str]]:
    """``kubectl port-forward`` to the router Service's http and metrics ports: their local URLs."""
    namespace, service = os.environ.get("TRTFLEET_E2E_ROUTER", "trtfleet-system/trtfleet-router").split("/")
    port, metrics_port = free_port(), free_port()
    proc = subprocess.Popen(
        [str(KUBECTL), "--kubeconfig", str(kubeconfig), "port-forward", "-n", namespace, f"svc/{service}",
         f"{port}:http", f"{metrics_port}:metrics"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        import httpx

        def ready() -> bool:
            assert proc.poll() is None, f"kubectl port-forward exited: {proc.stdout.read() if proc.stdout else ''}"
            try:
                return httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        eventually(ready, timeout=60, what="the router through kubectl port-forward")
        yield url, f"http://127.0.0.1:{metrics_port}"
    finally:
        proc.terminate()
        proc.wait(10)


def check_answer(model: str, answer: str) -> None:
    """Each sample adapter changes the tiny model's echo in a way anyone can see."""
    expected = {
        "tiny": PROMPT,
        "tiny-upper": PROMPT.upper(),
        "tiny-reverse": PROMPT[::-1],
    }
    if model == "tiny-json":
        assert json.loads(answer) == {"echo": PROMPT}, answer
    else:
        assert answer == expected[model], f"{model} answered {answer!r}"


def counter(metrics_text: str, name: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", metrics_text, re.M))


def test_openai_client_gets_adapter_specific_answers(router: tuple[str, str]) -> None:
    import httpx
    from openai import OpenAI

    router_url, metrics_url = router
    client = OpenAI(base_url=f"{router_url}/v1", api_key="unused", max_retries=0, timeout=120)
    listed = {m.id for m in client.models.list().data}
    assert {"tiny", "tiny-upper", "tiny-reverse", "tiny-json"} <= listed
    for _round in range(2):  # the second round finds the adapters warm somewhere
        for model in ("tiny", "tiny-upper", "tiny-reverse", "tiny-json"):
            completion = client.completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0)
            check_answer(model, completion.choices[0].text)
    chat = client.chat.completions.create(model="tiny-upper", messages=[{"role": "user", "content": PROMPT}],
                                          max_tokens=MAX_TOKENS, temperature=0)
    check_answer("tiny-upper", chat.choices[0].message.content or "")

    # The router sent weights only to cold pods: the second round was served warm somewhere.
    metrics = httpx.get(f"{metrics_url}/metrics", timeout=10).text
    assert counter(metrics, "trtfleet_router_adapter_cache_hits_total") >= 3, metrics
    assert counter(metrics, "trtfleet_router_requests_total") >= 9
