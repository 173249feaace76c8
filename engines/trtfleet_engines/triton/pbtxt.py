"""A tiny, deterministic writer of Triton ``config.pbtxt`` text (protobuf text format).

It writes only what trtfleet's model configs use: scalar fields, tensor lists, parameters,
instance groups, dynamic batching and ensemble steps. Every string goes through :func:`quote`, so a
path with quotes or backslashes cannot break the file. The output is checked in the tests by parsing it
with ``tritonclient.grpc.model_config_pb2.ModelConfig``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

ENGINE_DTYPE = "ENGINE_DTYPE"
"""Placeholder data type resolved to TYPE_FP16 or TYPE_BF16 (the engine dtype) at render time."""

LOGITS_DTYPE = "LOGITS_DTYPE"
"""Placeholder data type for logits tensors, resolved to TYPE_FP32 (trtllm-build's default logits dtype)."""


@dataclass(frozen=True)
class Tensor:
    """One entry of a config's ``input`` or ``output`` list."""

    name: str
    data_type: str
    dims: tuple[int, ...]
    optional: bool = False
    ragged: bool = False
    reshape_scalar: bool = False

    def resolved(self, engine_dtype: str, logits_dtype: str) -> Tensor:
        mapping = {ENGINE_DTYPE: engine_dtype, LOGITS_DTYPE: logits_dtype}
        data_type = mapping.get(self.data_type, self.data_type)
        return Tensor(self.name, data_type, self.dims, self.optional, self.ragged, self.reshape_scalar)


@dataclass(frozen=True)
class EnsembleStep:
    """One step of an ensemble: a model and its input/output name maps (model tensor -> ensemble tensor)."""

    model_name: str
    input_map: tuple[tuple[str, str], ...]
    output_map: tuple[tuple[str, str], ...]


def quote(text: str) -> str:
    """``text`` as a protobuf text-format string literal."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _dims(dims: Sequence[int]) -> str:
    return "[ " + ", ".join(str(d) for d in dims) + " ]" if dims else "[ ]"


def tensor_list(field: str, tensors: Iterable[Tensor], *, is_input: bool) -> list[str]:
    """Lines of an ``input [...]`` or ``output [...]`` block."""
    entries: list[str] = []
    for tensor in tensors:
        lines = [
            "  {",
            f"    name: {quote(tensor.name)}",
            f"    data_type: {tensor.data_type}",
            f"    dims: {_dims(tensor.dims)}",
        ]
        if is_input and tensor.reshape_scalar:
            lines.append("    reshape: { shape: [ ] }")
        if is_input and tensor.ragged:
            lines.append("    allow_ragged_batch: true")
        if is_input and tensor.optional:
            lines.append("    optional: true")
        lines.append("  }")
        entries.append("\n".join(lines))
    if not entries:
        return []
    return [f"{field} [", ",\n".join(entries), "]"]


def parameters(params: Sequence[tuple[str, str]]) -> list[str]:
    """Lines of ``parameters`` entries, all ``string_value`` as Triton backends expect, in the given order."""
    lines: list[str] = []
    for key, value in params:
        lines += [
            "parameters: {",
            f"  key: {quote(key)}",
            f"  value: {{ string_value: {quote(value)} }}",
            "}",
        ]
    return lines


def instance_group_cpu(count: int) -> list[str]:
    return ["instance_group [", "  {", f"    count: {count}", "    kind: KIND_CPU", "  }", "]"]


def dynamic_batching(
    *, max_queue_delay_microseconds: int | None = None, max_queue_size: int | None = None
) -> list[str]:
    if max_queue_delay_microseconds is None and max_queue_size is None:
        return ["dynamic_batching { }"]
    lines = ["dynamic_batching {"]
    if max_queue_delay_microseconds is not None:
        lines.append(f"  max_queue_delay_microseconds: {max_queue_delay_microseconds}")
    if max_queue_size is not None:
        lines.append(f"  default_queue_policy {{ max_queue_size: {max_queue_size} }}")
    lines.append("}")
    return lines


def ensemble_scheduling(steps: Sequence[EnsembleStep]) -> list[str]:
    blocks: list[str] = []
    for step in steps:
        lines = ["    {", f"      model_name: {quote(step.model_name)}", "      model_version: -1"]
        for key, value in step.input_map:
            lines.append(f"      input_map {{ key: {quote(key)} value: {quote(value)} }}")
        for key, value in step.output_map:
            lines.append(f"      output_map {{ key: {quote(key)} value: {quote(value)} }}")
        lines.append("    }")
        blocks.append("\n".join(lines))
    return ["ensemble_scheduling {", "  step [", ",\n".join(blocks), "  ]", "}"]
