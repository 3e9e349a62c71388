"""The planner's inputs: SLOs, the target, and the search space. Pure data, validated."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# the SLO document is shared with the plan file (trtpd.schema.plan); planner code takes it from here
from trtpd.schema.slo import SLO_DIR, Slo, load_slo, slo_path  # noqa: F401


class Target(BaseModel):
    """A request rate, or a token rate (input + output tokens per minute, as seed 004 states it)."""

    model_config = ConfigDict(extra="forbid")
    rate_per_s: float | None = Field(default=None, gt=0)
    tokens_per_min: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _one(self) -> "Target":
        if (self.rate_per_s is None) == (self.tokens_per_min is None):
            raise ValueError("give exactly one of rate_per_s and tokens_per_min")
        return self

    def requests_per_s(self, mean_tokens_per_request: float) -> float:
        if self.rate_per_s is not None:
            return self.rate_per_s
        assert self.tokens_per_min is not None
        return self.tokens_per_min / 60.0 / mean_tokens_per_request


class SearchSpace(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tp_prefill: list[int] = Field(default_factory=lambda: [1, 2, 4, 8])
    tp_decode: list[int] = Field(default_factory=lambda: [1, 2, 4, 8])
    weight_dtype: Literal["fp32", "fp16", "bf16", "fp8"] = "fp8"
    kv_dtype: Literal["fp16", "bf16", "fp8"] = "fp8"
    kv_link: Literal["auto", "nvlink", "network"] = "auto"
    kv_link_latency_s: float = Field(default=50e-6, ge=0)
    first_token_at: Literal["prefill", "decode"] = "decode"
    tokens_per_block: int = Field(default=32, gt=0)
    max_gpus: int | None = Field(default=None, gt=0)
    max_instances_per_role: int = Field(default=256, gt=0)
