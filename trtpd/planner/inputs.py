"""The planner's inputs: SLOs, the target, and the search space. Pure data, validated."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trtpd.perf.yaml_io import config_path, load_yaml_model
from trtpd.resources import configs_dir

SLO_DIR = configs_dir("slo")


class Slo(BaseModel):
    """TTFT and TPOT targets, met by `attainment` of the requests (both at once, as DistServe).

    attainment 0.9 means P90 SLOs: at least 90% of requests have TTFT <= ttft_s and TPOT <= tpot_s.
    """

    model_config = ConfigDict(extra="forbid")
    ttft_s: float = Field(gt=0)
    tpot_s: float = Field(gt=0)
    attainment: float = Field(default=0.9, gt=0, lt=1)

    @property
    def percentile(self) -> float:
        return self.attainment * 100


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


def slo_path(name_or_path: str) -> Path:
    return config_path("SLO", name_or_path, SLO_DIR)


def load_slo(name_or_path: str) -> Slo:
    return load_yaml_model(Slo, slo_path(name_or_path))
