"""A model's architecture numbers (``BaseModel.spec.dimensions``), normally read from the checkpoint's config.json."""

from __future__ import annotations

from pydantic import Field

from trtfleet.api.common import ApiModel


class ModelDimensions(ApiModel):
    """Architecture numbers, normally read from the checkpoint's config.json."""

    hidden_size: int = Field(ge=1, description="hidden_size")
    intermediate_size: int = Field(ge=1, description="intermediate_size")
    num_layers: int = Field(ge=1, description="num_hidden_layers")
    num_attention_heads: int = Field(ge=1, description="num_attention_heads")
    num_kv_heads: int = Field(ge=1, description="num_key_value_heads")
    head_dim: int | None = Field(default=None, ge=1, description="head_dim (default hidden/heads)")
    vocab_size: int = Field(ge=1, description="vocab_size")

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads
