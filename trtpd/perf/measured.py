"""Measured performance curves (written by `trtpd profile`) and the model that interpolates them."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trtpd.perf.interp import Curve1D, Grid2D


class PrefillCurve(BaseModel):
    model_config = ConfigDict(extra="forbid")
    num_tokens: list[int] = Field(min_length=1, description="batched prompt tokens per prefill batch")
    latency_s: list[float] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> "PrefillCurve":
        Curve1D(tuple(self.num_tokens), tuple(self.latency_s))  # raises with a message on bad shape
        return self


class DecodeGrid(BaseModel):
    model_config = ConfigDict(extra="forbid")
    batch_sizes: list[int] = Field(min_length=1)
    context_lens: list[int] = Field(min_length=1, description="tokens of context per sequence")
    step_latency_s: list[list[float]] = Field(description="rows follow batch_sizes, columns context_lens")

    @model_validator(mode="after")
    def _check(self) -> "DecodeGrid":
        Grid2D(tuple(self.batch_sizes), tuple(self.context_lens), tuple(tuple(r) for r in self.step_latency_s))
        return self


class ServingOverhead(BaseModel):
    """What the serving path adds to the engine's forward passes, measured through the real server
    (`trtpd profile --serving`, trtpd/bench/serving_probe.py): hops between Triton models, python-backend IPC, and
    the CPU the response pipeline takes from the engines on a small machine (trtpd/sim/shared_cores.py)."""

    model_config = ConfigDict(extra="forbid")
    response_latency_s: float = Field(default=0.0, ge=0, description="added to every response (request path)")
    step_overhead_s: float = Field(default=0.0, ge=0, description="added to every decode step")
    per_sequence_step_s: float = Field(default=0.0, ge=0, description="added to a decode step per sequence in it")
    host_cores: int = Field(default=0, ge=0, description="the cores the deployment's processes shared when "
                            "measured (engines, Triton, the serving path, the client); 0: each instance computes on "
                            "devices of its own (GPUs), nothing is shared")
    serving_cpu_per_token_s: float = Field(default=0.0, ge=0, description="CPU seconds the serving path outside "
                                           "the engines spends per streamed token (with host_cores)")


class MeasuredProfile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str
    tp: int = Field(default=1, gt=0)
    kv_dtype: str = "fp16"
    backend: str = "reference"
    measured_at: str = ""
    host: str = ""
    kv_capacity_tokens: int | None = Field(default=None, gt=0, description="KV pool size of the measured engine")
    prefill: PrefillCurve
    decode: DecodeGrid
    serving: dict[str, ServingOverhead] = Field(default_factory=dict,
                                                description="by deployment mode: disaggregated, colocated")


class MeasuredPerfModel:
    """PerfModel over measured curves. Prefill depends on batched tokens only (the profile's axis)."""

    def __init__(self, profile: MeasuredProfile, serving: ServingOverhead | None = None) -> None:
        self.profile = profile
        # where the numbers come from: "measured" (trtpd profile on an engine), or "measured: <backend>"
        self.source = "measured" if profile.backend == "reference" else f"measured: {profile.backend}"
        self.serving = serving or ServingOverhead()
        self._prefill = Curve1D(tuple(profile.prefill.num_tokens), tuple(profile.prefill.latency_s))
        d = profile.decode
        self._decode = Grid2D(tuple(d.batch_sizes), tuple(d.context_lens), tuple(tuple(r) for r in d.step_latency_s))
        self._min_context = float(min(d.context_lens))
        if profile.backend.startswith("aiconfigurator"):
            # GPU curves: a colocated step reads the weights once (the reference CPU engine's curves keep the
            # simulator's default, prefill + decode, as measured against it)
            self.mixed_step_s = self._mixed_step_s

    def _mixed_step_s(self, prefill_tokens: int, sum_sq_tokens: int, batch_size: int,
                      total_context_tokens: int) -> float:
        """One pass over the prompt tokens and the decode rows together: the prefill curve at all of them
        (one weight read, linear layers at prompt + decode tokens) plus the decode rows' attention over
        their context (the decode grid's growth with context, at this batch)."""
        if not batch_size:
            return self._prefill(prefill_tokens)
        ctx = total_context_tokens / batch_size
        attention = max(0.0, self._decode(batch_size, ctx) - self._decode(batch_size, self._min_context))
        return self._prefill(prefill_tokens + batch_size) + attention + self.serving.step_overhead_s

    def prefill_s(self, num_tokens: int, sum_sq_tokens: int = 0) -> float:
        return self._prefill(num_tokens)

    def decode_step_s(self, batch_size: int, total_context_tokens: int) -> float:
        forward = self._decode(batch_size, total_context_tokens / batch_size if batch_size else 0.0)
        return forward + self.serving.step_overhead_s + batch_size * self.serving.per_sequence_step_s
