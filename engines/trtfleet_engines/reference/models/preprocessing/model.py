"""Triton Python model ``preprocessing`` of the reference engine: text -> TRT-LLM input tensors.

The byte tokenizer turns ``QUERY`` into the prompt format the tiny model was trained on
(``<bos> text <sep>``); ``END_ID`` / ``PAD_ID`` default to the tokenizer's ``<eos>`` / ``<pad>``;
``STOP_WORDS_DICT`` / ``BAD_WORDS_DICT`` become TRT-LLM's [2, L] word lists (ids, end offsets).
"""

from __future__ import annotations

from typing import Any

import _trtfleet_bootstrap  # noqa: F401  (sys.path first)
import numpy as np
import triton_python_backend_utils as pb_utils

from trtfleet_engines.reference.text import encode_prompt, stack_word_lists, word_list
from trtfleet_engines.reference.tokenizer import EOS_ID, PAD_ID


def _input(request: Any, name: str) -> Any:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def _strings(value: Any) -> list[str]:
    if value is None:
        return []
    return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in value.reshape(-1) if v is not None]


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        self.model_name = args["model_name"]

    def execute(self, requests: list[Any]) -> list[Any]:
        return [self._one(request) for request in requests]

    def _one(self, request: Any) -> Any:
        queries = _input(request, "QUERY")
        batch = queries.shape[0]
        prompts = [encode_prompt(q) for q in _strings(queries)]
        end_id, pad_id = _input(request, "END_ID"), _input(request, "PAD_ID")
        end = np.full((batch, 1), EOS_ID if end_id is None else int(end_id.reshape(-1)[0]), np.int32)
        pad = np.full((batch, 1), PAD_ID if pad_id is None else int(pad_id.reshape(-1)[0]), np.int32)
        longest = max(len(p) for p in prompts)
        input_ids = np.full((batch, longest), pad[0, 0], np.int32)
        for i, prompt in enumerate(prompts):
            input_ids[i, : len(prompt)] = prompt
        stop = _input(request, "STOP_WORDS_DICT")
        bad = _input(request, "BAD_WORDS_DICT")
        outputs = {
            "INPUT_ID": input_ids,
            "REQUEST_INPUT_LEN": np.array([[len(p)] for p in prompts], np.int32),
            "REQUEST_OUTPUT_LEN": _input(request, "REQUEST_OUTPUT_LEN").astype(np.int32).reshape(batch, 1),
            "OUT_END_ID": end,
            "OUT_PAD_ID": pad,
            "STOP_WORDS_IDS": stack_word_lists(
                [word_list(_strings(None if stop is None else stop[i])) for i in range(batch)]
            ),
            "BAD_WORDS_IDS": stack_word_lists(
                [word_list(_strings(None if bad is None else bad[i])) for i in range(batch)]
            ),
        }
        wanted = request.requested_output_names()
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor(name, value) for name, value in outputs.items() if name in wanted]
        )
