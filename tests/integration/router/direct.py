"""Ask a reference worker directly (tritonclient.grpc, weights attached): the answers the router must match."""

from __future__ import annotations

import queue
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

from tests.integration.router.support import ConvertedAdapter


def direct_generate(
    worker: Any,
    prompt: str,
    max_tokens: int,
    adapter: ConvertedAdapter | None = None,
    *,
    send_weights: bool = True,
    model: str = "tensorrt_llm_bls",
) -> str:
    """The worker's greedy answer (raises on an error response)."""
    inputs = []

    def add(name: str, datatype: str, value: np.ndarray) -> None:
        tensor = grpcclient.InferInput(name, list(value.shape), datatype)
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)

    add("text_input", "BYTES", np.array([[prompt.encode()]], dtype=object))
    add("max_tokens", "INT32", np.array([[max_tokens]], dtype=np.int32))
    if adapter is not None:
        add("lora_task_id", "UINT64", np.array([[adapter.task_id]], dtype=np.uint64))
        if send_weights:
            weights, config = adapter.weights()
            add("lora_weights", "FP16", weights.astype(np.float16))
            add("lora_config", "INT32", config.astype(np.int32))
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(worker.grpc_url)
    client.start_stream(lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        text = b""
        while True:
            result, error = results.get(timeout=60)
            if error is not None:
                raise RuntimeError(str(error))
            output = result.as_numpy("text_output")
            if output is not None:
                text += b"".join(output.reshape(-1).tolist())
            if result.get_response().parameters["triton_final_response"].bool_param:
                return text.decode()
    finally:
        client.stop_stream()
        client.close()
