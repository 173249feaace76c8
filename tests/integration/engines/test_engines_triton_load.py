"""Rendered repositories load in a real tritonserver and a request flows through the ensemble's wiring.

Uses the tritonserver binary of the nvidia-pytriton wheel (CPU). The ``tensorrt_llm`` model is rendered
with the python backend (``reference=True``: same inputs, outputs and parameters as the C++ backend's) and
every python model is a stand-in, so what is tested is the rendered configs: Triton type-checks each
ensemble step's tensors against the models' configs at load, then runs one streamed request through
preprocessing -> tensorrt_llm -> postprocessing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from trtfleet_engines.triton import MODEL_NAMES, render_model_repository

from trtfleet.api import BaseModel
from trtfleet.api.basemodel import BaseModelSpec

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
READY_TIMEOUT_S = 90.0

# The python backend's stub ignores PYTHONPATH and imports model.py first: each stand-in model begins by
# adding this interpreter's site dirs (passed in TRTFLEET_TEST_SITE_DIRS) so numpy imports.
BOOTSTRAP = """import os as _os
import site as _site
for _d in _os.environ.get("TRTFLEET_TEST_SITE_DIRS", "").split(_os.pathsep):
    if _d:
        _site.addsitedir(_d)
"""

PREPROCESSING = """import numpy as np
import triton_python_backend_utils as pb

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb.get_input_tensor_by_name(request, "QUERY").as_numpy()[0][0]
            ids = np.array([list(text)], dtype=np.int32)
            out_len = pb.get_input_tensor_by_name(request, "REQUEST_OUTPUT_LEN").as_numpy().astype(np.int32)
            responses.append(pb.InferenceResponse(output_tensors=[
                pb.Tensor("INPUT_ID", ids),
                pb.Tensor("REQUEST_INPUT_LEN", np.array([[ids.shape[1]]], dtype=np.int32)),
                pb.Tensor("REQUEST_OUTPUT_LEN", out_len),
                pb.Tensor("OUT_END_ID", np.array([[0]], dtype=np.int32)),
                pb.Tensor("OUT_PAD_ID", np.array([[0]], dtype=np.int32)),
            ]))
        return responses
"""

TENSORRT_LLM = """import numpy as np
import triton_python_backend_utils as pb

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            ids = pb.get_input_tensor_by_name(request, "input_ids").as_numpy()
            out_len = pb.get_input_tensor_by_name(request, "request_output_len").as_numpy()
            out_len = int(out_len.reshape(-1)[0])
            task = pb.get_input_tensor_by_name(request, "lora_task_id")
            shift = int(task.as_numpy().reshape(-1)[0]) if task is not None else 0
            tokens = (ids[:, ::-1][:, :out_len] + shift).astype(np.int32)
            sender.send(pb.InferenceResponse(output_tensors=[
                pb.Tensor("output_ids", tokens.reshape(1, 1, -1)),
                pb.Tensor("sequence_length", np.array([[tokens.shape[1]]], dtype=np.int32)),
            ]))
            sender.send(flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

POSTPROCESSING = """import numpy as np
import triton_python_backend_utils as pb

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            tokens = pb.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
            text = bytes(int(t) for t in tokens.reshape(-1))
            responses.append(pb.InferenceResponse(output_tensors=[
                pb.Tensor("OUTPUT", np.array([text], dtype=np.object_))]))
        return responses
"""

IDLE = """class TritonPythonModel:
    def execute(self, requests):
        return None
"""


def _pytriton_root() -> Path:
    spec = importlib.util.find_spec("pytriton")
    # A dependency of the [reference] extra that `make install` installs: missing is a failure, not a skip.
    assert spec is not None and spec.submodule_search_locations, "nvidia-pytriton is not installed: make install"
    return Path(next(iter(spec.submodule_search_locations)))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    log: Path

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}{path}", timeout=5) as response:
            return json.loads(response.read() or b"null")

    def post(self, path: str) -> Any:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.http_port}{path}", data=b"{}", method="POST"
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.loads(response.read() or b"null")


def _backend_dir(tmp_path: Path, package: Path) -> Path:
    python_dir = tmp_path / "backends" / "python"
    python_dir.mkdir(parents=True)
    triton = package / "tritonserver"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    (python_dir / "libtriton_python.so").symlink_to(triton / "backends" / "python" / "libtriton_python.so")
    (python_dir / "triton_python_backend_stub").symlink_to(
        triton / "python_backend_stubs" / version / "triton_python_backend_stub"
    )
    (python_dir / "triton_python_backend_utils.py").symlink_to(
        triton / "backends" / "python" / "triton_python_backend_utils.py"
    )
    return tmp_path / "backends"


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Any]:
    package = _pytriton_root()
    servers: list[Server] = []

    def start(repo: Path) -> Server:
        http_port, grpc_port = _free_port(), _free_port()
        log = tmp_path / f"triton-{http_port}.log"
        env = dict(os.environ)
        libs = [sysconfig.get_config_var("LIBDIR") or "", str(package.parent / "nvidia_pytriton.libs")]
        env["LD_LIBRARY_PATH"] = os.pathsep.join([*libs, env.get("LD_LIBRARY_PATH", "")])
        env["TRTFLEET_TEST_SITE_DIRS"] = os.pathsep.join(p for p in sys.path if p.endswith("site-packages"))
        command = [
            str(package / "tritonserver" / "bin" / "tritonserver"),
            f"--model-repository={repo}",
            f"--backend-directory={_backend_dir(tmp_path / str(http_port), package)}",
            f"--http-port={http_port}",
            f"--grpc-port={grpc_port}",
            "--allow-metrics=false",
            "--http-address=127.0.0.1",
            "--grpc-address=127.0.0.1",
        ]
        with log.open("wb") as handle:
            process = subprocess.Popen(command, env=env, stdout=handle, stderr=subprocess.STDOUT)
        server = Server(process, http_port, grpc_port, log)
        servers.append(server)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"tritonserver exited with {process.returncode}:\n{log.read_text()[-4000:]}")
            try:
                server.get("/v2/health/ready")
                return server
            except OSError:
                assert time.monotonic() < deadline, log.read_text()[-4000:]
                time.sleep(0.05)

    yield start
    for server in servers:
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()
            raise AssertionError("tritonserver did not exit within 30 s of SIGTERM") from None
        assert server.process.returncode == 0, f"tritonserver exited with status {server.process.returncode}"


def _repository(spec: BaseModelSpec, repo: Path) -> Path:
    render_model_repository(spec, "/unused/engine", repo, tokenizer_dir="/unused/tokenizer", reference=True)
    for name, code in (
        ("preprocessing", PREPROCESSING),
        ("tensorrt_llm", TENSORRT_LLM),
        ("postprocessing", POSTPROCESSING),
        ("tensorrt_llm_bls", IDLE),
    ):
        (repo / name / "1" / "model.py").write_text(BOOTSTRAP + code)
    return repo


def _spec(patch: dict[str, Any]) -> BaseModelSpec:
    doc = yaml.safe_load((ROOT / "examples" / "basemodel-llama3-8b-tensorrtllm.yaml").read_text())
    doc["spec"].update(patch)
    return BaseModel.model_validate(doc).spec


def _stream(server: Server, inputs: dict[str, np.ndarray]) -> list[str]:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    results: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    tensors = []
    for name, value in inputs.items():
        tensor = grpcclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
        tensor.set_data_from_numpy(value)
        tensors.append(tensor)
    client.start_stream(callback=lambda result, error: results.put(error or result))
    try:
        client.async_stream_infer("ensemble", tensors, enable_empty_final_response=True)
        texts: list[str] = []
        while True:
            item = results.get(timeout=30)
            if isinstance(item, Exception):
                raise item
            text = item.as_numpy("text_output")
            if text is not None:
                texts.append(text.reshape(-1)[0].decode())
            if item.get_response().parameters["triton_final_response"].bool_param:
                return texts
    finally:
        client.stop_stream()
        client.close()


@pytest.mark.parametrize(
    ("patch", "lora_type"),
    [({}, "TYPE_FP16"), ({"dtype": "bfloat16"}, "TYPE_BF16"), ({"lora": {"enabled": False}}, None)],
    ids=["fp16-lora", "bf16-lora", "no-lora"],
)
def test_repository_loads_and_the_ensemble_runs(
    tmp_path: Path, start_server: Any, patch: dict[str, Any], lora_type: str | None
) -> None:
    spec = _spec(patch)
    server = start_server(_repository(spec, tmp_path / "repo"))
    index = server.post("/v2/repository/index")
    assert sorted((m["name"], m["state"]) for m in index) == sorted((n, "READY") for n in MODEL_NAMES)
    config = server.get("/v2/models/ensemble/config")
    types = {tensor["name"]: tensor["data_type"] for tensor in config["input"]}
    assert types.get("lora_weights") == lora_type
    inputs = {
        "text_input": np.array([[b"hello"]], dtype=np.object_),
        "max_tokens": np.array([[4]], dtype=np.int32),
        "stream": np.array([[True]], dtype=bool),
    }
    if lora_type is not None:
        inputs["lora_task_id"] = np.array([[1]], dtype=np.uint64)
    expected = "pmmf" if lora_type is not None else "olle"  # reversed, first 4, shifted by the task id
    assert _stream(server, inputs) == [expected]
