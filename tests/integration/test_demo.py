"""``trtfleet demo`` as a user runs it: real converter, tritonserver workers and router subprocesses.

Every process the demo starts inherits a marker in its environment; after the demo exits, no process
on the machine may still carry it (children, tritonserver, its Python backend stubs), and the demo's
temporary directory must be gone.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.controlplane import eventually, free_port

pytestmark = pytest.mark.integration

PROMPT = "hello world"
MARK_ENV = "TRTFLEET_DEMO_TEST_MARK"
ANSWER = re.compile(r'^\s+(\S+)\s+-> (".*")$', re.M)
WORKDIR = re.compile(r"logs in (\S+)/logs\)")
DEMO_TIMEOUT_S = 420
STOP_TIMEOUT_S = 45


def processes_marked(mark: str) -> list[str]:
    """``pid cmdline`` of every process whose environment carries ``mark``."""
    found = []
    needle = f"{MARK_ENV}={mark}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{entry.name} {cmd[:200]}")
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def demo_argv(*extra: str) -> list[str]:
    return [sys.executable, "-m", "trtfleet", "demo", "--http-port", str(free_port()), "--grpc-port",
            str(free_port()), "--metrics-port", str(free_port()), "--prompt", PROMPT, *extra]


def check_answer(model: str, answer: str) -> None:
    """What each sample adapter visibly does to the tiny model's echo of the prompt."""
    if model == "tiny-json":
        assert json.loads(answer) == {"echo": PROMPT}, f"{model} answered {answer!r}"
        return
    expected = {"tiny": PROMPT, "tiny-upper": PROMPT.upper(), "tiny-reverse": PROMPT[::-1]}[model]
    assert answer == expected, f"{model} answered {answer!r}, expected {expected!r}"


def assert_nothing_left(mark: str, output: str) -> None:
    eventually(lambda: not processes_marked(mark), timeout=STOP_TIMEOUT_S,
               what=f"every demo process to exit; left: {processes_marked(mark)}")
    workdir = WORKDIR.search(output)
    assert workdir is not None, output
    assert not Path(workdir.group(1)).exists(), f"the demo left {workdir.group(1)} behind"


def print_demo_output(output: str) -> None:
    """The demo's output and the tails of its logs, for a failed test's report (a killed demo leaves them)."""
    print(output)
    workdir = WORKDIR.search(output)
    logs = Path(workdir.group(1)) / "logs" if workdir is not None else None
    for log in sorted(logs.glob("*.log")) if logs is not None and logs.is_dir() else []:
        print(f"--- {log.name} (last 40 lines)")
        print("\n".join(log.read_text(errors="replace").splitlines()[-40:]))


@contextmanager
def live_demo(argv: list[str], mark: str) -> Iterator[tuple[subprocess.Popen[str], list[str]]]:
    """The demo running, its output lines collected as they come; killed if it still runs when the block ends, and
    then (on a block that passed) nothing it started may be left."""
    proc = subprocess.Popen(argv, env={**os.environ, MARK_ENV: mark}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        yield proc, lines
    except BaseException:
        print_demo_output("".join(lines))
        raise
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(10)
    assert_nothing_left(mark, "".join(lines))


@pytest.fixture
def mark() -> Iterator[str]:
    token = secrets.token_hex(8)
    yield token
    for line in processes_marked(token):  # a failed test must not leave tritonservers running
        os.kill(int(line.split()[0]), signal.SIGKILL)


@pytest.mark.parametrize("runtime", ["tensorrtllm", "pytorch"])
def test_demo_once_answers_with_every_adapter_and_cleans_up(mark: str, runtime: str) -> None:
    env = {**os.environ, MARK_ENV: mark}
    done = subprocess.run(demo_argv("--once", "--workers", "2", "--runtime", runtime), env=env,
                          capture_output=True, text=True, timeout=DEMO_TIMEOUT_S)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    answers = {model: json.loads(text) for model, text in ANSWER.findall(done.stdout)}
    assert sorted(answers) == ["tiny", "tiny-json", "tiny-reverse", "tiny-upper"], output
    for model, answer in answers.items():
        check_answer(model, answer)
    assert "curl -s http://127.0.0.1:" in done.stdout and "from openai import OpenAI" in done.stdout
    assert re.search(r"workers 2/2 ready · requests 4 ok, 0 failed", done.stdout), done.stdout
    assert_nothing_left(mark, output)


def run_batch_example(lines: list[str]) -> None:
    """The batch snippet the demo printed, run as a user would paste it: one answer per model."""
    start = next(i for i, line in enumerate(lines) if line.startswith("Batches ("))
    snippet = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        snippet.append(line[2:])
    done = subprocess.run([sys.executable, "-c", "".join(snippet)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(text) for text in done.stdout.splitlines() if text.strip()]
    results = {row["custom_id"]: row for row in rows}
    assert sorted(results) == ["tiny-1", "tiny-upper-1"], done.stdout
    check_answer("tiny-upper", results["tiny-upper-1"]["response"]["body"]["choices"][0]["text"])


def test_demo_serves_openai_clients_and_stops_on_sigint(mark: str) -> None:
    from openai import OpenAI

    argv = demo_argv("--workers", "1", "--adapters", "upper", "--refresh-s", "0.5")
    http_port = argv[argv.index("--http-port") + 1]
    with live_demo(argv, mark) as (proc, lines):
        eventually(lambda: proc.poll() is not None or any("live summary" in line for line in lines),
                   timeout=DEMO_TIMEOUT_S, what="the demo to be ready")
        assert proc.poll() is None, "".join(lines)
        client = OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="unused", max_retries=0)
        for _ in range(3):
            chat = client.chat.completions.create(
                model="tiny-upper", messages=[{"role": "user", "content": PROMPT}], max_tokens=48, temperature=0)
            check_answer("tiny-upper", chat.choices[0].message.content or "")
        # The live summary catches up: three requests, the first one cold, the next two warm.
        eventually(lambda: any("requests 3 ok" in line and "hit rate 67%" in line for line in lines),
                   timeout=30, what=f"the live summary to show the requests:\n{''.join(lines[-5:])}")
        assert any("worker-1: tiny-upper" in line for line in lines), "".join(lines[-5:])
        run_batch_example(lines)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(STOP_TIMEOUT_S) == 0, "".join(lines)
    output = "".join(lines)
    assert "SIGINT: stopping the demo" in output and output.rstrip().endswith("stopped")


def test_a_worker_whose_stub_dies_restarts_and_no_client_sees_it(mark: str) -> None:
    """A Python backend stub killed by SIGBUS (Triton's python_backend crash, triton-inference-server/server#7938):
    its worker stops, the router answers from the other one, the demo restarts the worker on its ports."""
    from openai import OpenAI

    argv = demo_argv("--workers", "2", "--runtime", "tensorrtllm", "--refresh-s", "0.5")
    http_port = argv[argv.index("--http-port") + 1]
    with live_demo(argv, mark) as (proc, lines):
        eventually(lambda: proc.poll() is not None or any("live summary" in line for line in lines),
                   timeout=DEMO_TIMEOUT_S, what="the demo to be ready")
        assert proc.poll() is None, "".join(lines)
        stubs = [line for line in processes_marked(mark) if "triton_python_backend_stub.real" in line]
        assert stubs, processes_marked(mark)
        os.kill(int(stubs[0].split()[0]), signal.SIGBUS)
        client = OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="unused", max_retries=0)
        for model in ["tiny-upper", "tiny-reverse", "tiny-json"] * 3:
            answer = client.completions.create(model=model, prompt=PROMPT, max_tokens=48, temperature=0)
            check_answer(model, answer.choices[0].text)
        eventually(lambda: any("restarting it as a kubelet would (restart 1 of 3)" in line for line in lines),
                   timeout=60, what=f"the demo to restart the worker:\n{''.join(lines[-5:])}")
        restarted = next(i for i, line in enumerate(lines) if "as a kubelet would" in line)
        assert "killed by SIGBUS" in lines[restarted], lines[restarted]
        eventually(lambda: any("workers 2/2 ready" in line for line in lines[restarted:]),
                   timeout=120, what=f"the restarted worker to be ready:\n{''.join(lines[-5:])}")
        assert proc.poll() is None, "".join(lines)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(STOP_TIMEOUT_S) == 0, "".join(lines)


@pytest.mark.parametrize("runtime", ["pytorch", "tensorrtllm"])
def test_demo_gateway_answers_through_envoy(mark: str, runtime: str) -> None:
    """``trtfleet demo --gateway`` (``make demo-gateway``): the clients call Envoy only, the router is its endpoint
    picker; each adapter answers as itself (the openai client on trtllm-serve pods, Triton's generate on Triton
    pods), and the picker's books count every request."""
    gateway_port = free_port()
    argv = demo_argv("--gateway", "--gateway-port", str(gateway_port), "--epp-port", str(free_port()),
                     "--workers", "2", "--runtime", runtime, "--refresh-s", "0.5")
    gateway = f"http://127.0.0.1:{gateway_port}"
    models = ["tiny", "tiny-upper", "tiny-reverse", "tiny-json"]
    with live_demo(argv, mark) as (proc, lines):
        eventually(lambda: proc.poll() is not None or any("live summary" in line for line in lines),
                   timeout=DEMO_TIMEOUT_S, what="the demo to be ready")
        assert proc.poll() is None, "".join(lines)
        assert any(f"Envoy on 127.0.0.1:{gateway_port}" in line for line in lines), "".join(lines)
        if runtime == "pytorch":
            from openai import OpenAI

            client = OpenAI(base_url=f"{gateway}/v1", api_key="unused", max_retries=0, timeout=60)
            assert {m.id for m in client.models.list().data} >= set(models)
            for model in models:
                chat = client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": PROMPT}], max_tokens=48, temperature=0)
                assert chat.model == model
                check_answer(model, chat.choices[0].message.content or "")
        else:
            import httpx

            for model in models:
                answer = httpx.post(f"{gateway}/v2/models/{model}/generate",
                                    json={"text_input": PROMPT, "max_tokens": 48}, timeout=60)
                assert answer.status_code == 200, answer.text
                assert answer.json()["model_name"] == model
                check_answer(model, answer.json()["text_output"])
        sent = len(models) + (runtime == "pytorch")  # and the model list, which the picker answers itself
        eventually(lambda: any(f"requests {sent} ok, 0 failed" in line for line in lines), timeout=30,
                   what=f"the live summary to count the gateway's requests:\n{''.join(lines[-5:])}")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(STOP_TIMEOUT_S) == 0, "".join(lines)
