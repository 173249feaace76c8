"""The README's CPU quick start, run as written: its blocks tagged ``quickstart`` are extracted and run.

The bash block runs line by line from the repository root; its long-running ``trtfleet demo`` line is started in
the background, with ``--http-port``/``--grpc-port``/``--metrics-port`` appended on free ports (this machine is
shared: 8080 may be taken), and the Python block then runs with this environment's interpreter, its
``127.0.0.1:8080`` pointed at the same port. The answer must be the sample adapter's (``tiny-upper``: the prompt in
upper case), read through the real openai client from the real router and reference workers. Ctrl-C (SIGINT)
stops the demo, which must leave no process behind.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.integration.test_demo import MARK_ENV, processes_marked
from tests.support.controlplane import eventually, free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```(\w+) quickstart\n(.*?)^```", re.M | re.S)
START_TIMEOUT_S = 300


def quickstart_blocks() -> list[tuple[str, str]]:
    return [(lang, text) for lang, text in BLOCK.findall((ROOT / "README.md").read_text())]


def test_readme_quickstart_answers_through_the_openai_client(tmp_path: Path) -> None:
    blocks = quickstart_blocks()
    assert [lang for lang, _ in blocks] == ["bash", "python"], blocks
    commands = [line.split("#", 1)[0].strip() for line in blocks[0][1].splitlines()]
    commands = [c for c in commands if c]
    demo = [c for c in commands if " demo" in c]
    assert len(demo) == 1 and commands[-1] == demo[0], commands
    mark = secrets.token_hex(8)
    env = {**os.environ, MARK_ENV: mark}
    for command in commands[:-1]:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=1200)
        assert done.returncode == 0, f"{command}:\n{done.stdout}\n{done.stderr}"
    http = free_port()
    ports = f" --http-port {http} --grpc-port {free_port()} --metrics-port {free_port()}"
    log = tmp_path / "demo.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(["bash", "-c", f"exec {demo[0]}{ports}"], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        def ready() -> bool:
            assert proc.poll() is None, f"the demo exited:\n{log.read_text()[-4000:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http}/v1/models", timeout=2) as resp:
                    return b"tiny-upper" in resp.read()
            except OSError:
                return False

        eventually(ready, timeout=START_TIMEOUT_S, what="the demo's router to list tiny-upper")
        script = blocks[1][1].replace("127.0.0.1:8080", f"127.0.0.1:{http}")
        done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "HELLO WORLD", done.stdout
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # Ctrl-C, as the README says
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for line in processes_marked(mark):  # a failed run must not leave workers behind
            os.kill(int(line.split()[0]), signal.SIGKILL)
    assert proc.returncode in (0, -signal.SIGINT, 130), log.read_text()[-4000:]
    eventually(lambda: not processes_marked(mark), timeout=45, what="every demo process to exit")
