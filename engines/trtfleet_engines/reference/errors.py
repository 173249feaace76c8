"""The CPU reference engine's error tree, and the exact texts TensorRT-LLM answers with.

::

    ReferenceEngineError             anything the reference engine refuses or fails to do
    ├── RequestRejected              a request the engine answers with an error response
    │   │                            (``text`` is what the client sees, TRT-LLM's words)
    │   ├── EnqueueRejected          refused before it got an executor request id: raw text,
    │   │   │                        as the TRT-LLM backend's ``sendEnqueueResponse`` sends it
    │   │   └── QueueFullError       ``Maximum queue size of N has been reached, please try again later``
    │   └── ExecutorRequestFailed    failed inside the executor: wrapped as
    │                                ``Executor failed process requestId <n> due to the following error: ...``
    │                                (LoRA cache miss, cache full, LoRA validation)
    ├── RepositoryError              a model repository that cannot be built (bad model dir, no renderer)
    └── WorkerError                  the tritonserver process cannot be started or did not become ready
        └── TritonNotInstalledError  the nvidia-pytriton wheel (which ships tritonserver) is missing

Mapping to the wire happens in exactly one place, the ``tensorrt_llm`` Python model: every
:class:`RequestRejected` becomes ``InferenceResponse(error=TritonError(text))`` with the final flag, which
Triton delivers as a gRPC stream ``error_message``, gRPC INTERNAL or HTTP 500, like the real backend.
"""

from __future__ import annotations

from typing import Final

QUEUE_FULL_TEXT: Final = "Maximum queue size of {max_queue_size} has been reached, please try again later"
EXECUTOR_FAILED_TEXT: Final = "Executor failed process requestId {request_id} due to the following error: {text}"
LORA_TASK_ID_REQUIRED_TEXT: Final = "lora_task_id must be set for LoRA inference"
LORA_DTYPE_TEXT: Final = "Expected lora weights to be the same data type as base model"
LORA_MODULE_TEXT: Final = "lora module {name} not enabled for this model"
LORA_RANK_TEXT: Final = "Invalid low_rank ({rank}). low_rank must be smaller than mMaxLowRank ({max_rank})"
LORA_BOTH_TENSORS_TEXT: Final = "Request for LoRA inference must have both lora_weights and lora_keys"
PROMPT_TOO_LONG_TEXT: Final = (
    "Prompt length ({length}) exceeds maximum input length ({max_input_len}). Set log level to info and "
    "check TRTGptModel logs for how maximum input length is set"
)


class ReferenceEngineError(Exception):
    """Base of every error the reference engine raises on purpose."""


class RequestRejected(ReferenceEngineError):
    """A request answered with an error response; ``text`` is exactly what the client receives."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class EnqueueRejected(RequestRejected):
    """Refused at enqueue, before an executor request id exists: the text is sent unwrapped."""


class QueueFullError(EnqueueRejected):
    """More requests wait than ``max_queue_size``: back-pressure, retry later or elsewhere."""

    def __init__(self, max_queue_size: int) -> None:
        super().__init__(QUEUE_FULL_TEXT.format(max_queue_size=max_queue_size))
        self.max_queue_size = max_queue_size


class ExecutorRequestFailed(RequestRejected):
    """Failed in the executor; ``reason`` is TRT-LLM's own text, ``text`` the Triton backend's wrapping."""

    def __init__(self, request_id: int, reason: str) -> None:
        super().__init__(EXECUTOR_FAILED_TEXT.format(request_id=request_id, text=reason))
        self.request_id = request_id
        self.reason = reason


class RepositoryError(ReferenceEngineError):
    """A reference model repository that cannot be built."""


class WorkerError(ReferenceEngineError):
    """The tritonserver process could not be started or did not become ready."""


class TritonNotInstalledError(WorkerError):
    """The ``nvidia-pytriton`` wheel, which ships the tritonserver binary, is not installed."""
