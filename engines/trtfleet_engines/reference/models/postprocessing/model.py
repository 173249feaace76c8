"""Triton Python model ``postprocessing`` of the reference engine: ``TOKENS_BATCH`` -> text ``OUTPUT``.

Each response is decoded on its own (in a streaming ensemble that is one token's bytes, so a multi-byte
character split across tokens shows as U+FFFD there; the BLS model decodes incrementally instead).
"""

from __future__ import annotations

from typing import Any

import _trtfleet_bootstrap  # noqa: F401  (sys.path first)
import numpy as np
import triton_python_backend_utils as pb_utils

from trtfleet_engines.reference.tokenizer import ByteTokenizer


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        self.tokenizer = ByteTokenizer()

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
            lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy()
            if tokens.ndim == 2:  # [batch, tokens] without a beam dimension
                tokens = tokens[:, None, :]
            lengths = lengths.reshape(tokens.shape[0], tokens.shape[1])
            texts = np.empty(lengths.shape, dtype=object)
            for b in range(tokens.shape[0]):
                for beam in range(tokens.shape[1]):
                    ids = tokens[b, beam, : int(lengths[b, beam])].tolist()
                    texts[b, beam] = self.tokenizer.decode(ids).encode("utf-8")
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT", texts)]))
        return responses
