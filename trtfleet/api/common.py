"""Building blocks shared by the trtfleet custom resources.

Every model is frozen, forbids unknown fields and speaks camelCase on the wire
(``populate_by_name`` lets Python code use snake_case). The CRD schemas in
``crds/`` are generated from these classes (see :mod:`trtfleet.api.crdgen`), so a
field's docstring-like ``description`` is what ``kubectl explain`` shows.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any

import pydantic
from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_camel

GROUP = "trtfleet.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

SOURCE_URI_PATTERN = r"^(hf://[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._/-]*|s3://[a-z0-9][a-z0-9.-]{1,62}/.*|pvc://[a-z0-9][a-z0-9.-]*/.*|file:///.*)$"


class ApiModel(pydantic.BaseModel):
    """Base of every API type: frozen, strict about unknown fields, camelCase aliases."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        use_enum_values=False,
    )

    def to_wire(self) -> dict[str, Any]:
        """The object as Kubernetes stores it: camelCase keys, no unset optionals."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class SecretRef(ApiModel):
    name: str = Field(min_length=1, max_length=253, description="Name of a Secret in the same namespace.")


class Source(ApiModel):
    """Where weights come from."""

    uri: str = Field(
        pattern=SOURCE_URI_PATTERN,
        max_length=2048,
        description=(
            "Location of the weights: hf://org/name, s3://bucket/path, pvc://claim/path or file:///path."
        ),
    )
    revision: str | None = Field(
        default=None,
        max_length=256,
        description="Immutable revision (git commit or tag for hf://, object version for s3://). "
        "Part of the content address: a new revision means a new engine or a new adapter task id.",
    )
    secret_ref: SecretRef | None = Field(
        default=None,
        description="Secret with credentials (HF_TOKEN or AWS_* keys), mounted as environment variables.",
    )


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(ApiModel):
    """A Kubernetes-style condition (metav1.Condition)."""

    type: str = Field(max_length=316, description="Condition type, e.g. Ready, EngineBuilt, CapacityPlanned.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(max_length=1024, description="CamelCase reason a program can match on.")
    message: str = Field(default="", max_length=32768, description="What is wrong and how to fix it.")
    last_transition_time: str | None = Field(default=None, description="RFC 3339 time of the last change.")
    observed_generation: int | None = Field(default=None, ge=0, description="Generation this was computed for.")


_QUANTITY_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
_QUANTITY_FACTORS = {
    None: 1,
    "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}


def parse_quantity(value: int | str) -> int:
    """A Kubernetes byte quantity ("1Gi", "512Mi", 1073741824) as an integer number of bytes."""
    if isinstance(value, bool):
        raise ValueError("a quantity is a number or a string such as 1Gi, not a boolean")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"quantity {value} is negative")
        return value
    match = _QUANTITY_RE.match(value.strip())
    if match is None:
        raise ValueError(f"{value!r} is not a byte quantity (examples: 1073741824, 1Gi, 512Mi, 2G)")
    number, suffix = match.groups()
    return int(float(number) * _QUANTITY_FACTORS[suffix])


def _check_quantity(value: int | str) -> int | str:
    parse_quantity(value)
    return value


Quantity = Annotated[
    int | str,
    pydantic.AfterValidator(_check_quantity),
    pydantic.WithJsonSchema({"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]}),
]
