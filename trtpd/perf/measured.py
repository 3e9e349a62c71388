"""Measured performance curves (written by `trtpd profile`) and the model that interpolates them."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trtpd.perf.interp import Curve1D, Grid2D


class PrefillCurve(BaseModel):
    """Prefill latency by batched prompt tokens, and (measured profiles since 2026-12-04) what one long prompt
    costs beyond the same tokens as short prompts: attention grows with each prompt's length squared, so a batch's
    latency depends on how its tokens are split into prompts, not on their number alone (on the reference CPU engine
    one prompt of 1,024 tokens takes 3x the time of 16 prompts of 64). `trtpd profile` measures `latency_s` on
    batches of prompts of at most `prompt_tokens` each (trtpd.perf.profiling.batch_prompt_lens) and
    `single_latency_s` on one prompt of each of `single_prompt_tokens`; MeasuredPerfModel.prefill_s combines them."""

    model_config = ConfigDict(extra="forbid")
    num_tokens: list[int] = Field(min_length=1, description="batched prompt tokens per prefill batch")
    latency_s: list[float] = Field(min_length=1)
    prompt_tokens: int | None = Field(default=None, gt=0, description="the longest prompt in each batch of the "
                                      "curve (the batches split their tokens evenly into prompts of at most this "
                                      "many); absent: not recorded, the curve is read by batched tokens alone")
    single_prompt_tokens: list[int] = Field(default_factory=list, description="lengths of the single prompts "
                                            "measured, each longer than prompt_tokens")
    single_latency_s: list[float] = Field(default_factory=list, description="latency of one prompt of each length")

    @model_validator(mode="after")
    def _check(self) -> "PrefillCurve":
        Curve1D(tuple(self.num_tokens), tuple(self.latency_s))  # raises with a message on bad shape
        if self.single_prompt_tokens or self.single_latency_s:
            if self.prompt_tokens is None:
                raise ValueError("single_prompt_tokens needs prompt_tokens (the curve's longest prompt)")
            Curve1D(tuple(self.single_prompt_tokens), tuple(self.single_latency_s))
            if self.single_prompt_tokens[0] <= self.prompt_tokens:
                raise ValueError(f"single_prompt_tokens must be longer than prompt_tokens ({self.prompt_tokens}); "
                                 f"got {self.single_prompt_tokens[0]}")
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
    step_overhead_s: float = Field(default=0.0, description="added to every decode step; negative when the server's "
                                   "steps grow with the batch faster from 1 to 2 than beyond (the line through the "
                                   "traced steps' periods then has a negative intercept, "
                                   "trtpd/bench/serving_probe.fit_step_costs)")
    per_sequence_step_s: float = Field(default=0.0, ge=0, description="added to a decode step per sequence in it")
    host_cores: int = Field(default=0, ge=0, description="the cores the deployment's processes shared when "
                            "measured (engines, Triton, the serving path, the client); 0: each instance computes on "
                            "devices of its own (GPUs), nothing is shared")
    serving_cpu_per_token_s: float = Field(default=0.0, ge=0, description="seconds of the host's cores the "
                                           "serving path outside the engines takes from them per streamed token "
                                           "(with host_cores): the CPU it spends (disaggregated), or the slope of "
                                           "two colocated instances' slowdown against the tokens they stream, at "
                                           "most that CPU (trtpd/bench/serving_probe.fit_shared_demand)")
    serving_cpu_per_request_s: float = Field(default=0.0, ge=0, description="seconds of the host's cores the "
                                             "serving path spends on a request beyond its streamed tokens (with "
                                             "host_cores): intake, the orchestrator's hops, the KV handoff, the "
                                             "end of the stream, in the server's processes but the engine stubs "
                                             "(whose serving work is in their steps, as the step costs); lone "
                                             "requests of two tokens through the real server, their CPU from /proc "
                                             "less those processes' idle CPU (trtpd/bench/serving_probe.py); the "
                                             "simulator runs it as a job on the shared cores from the request's "
                                             "arrival (trtpd/sim/shared_cores.py). 0 in profiles measured before "
                                             "2026-12-06")
    step_cores: float = Field(default=1.0, ge=1, description="the host's cores a step in flight takes as the other "
                              "engines feel it (with host_cores): its engine thread, and what the serving path's "
                              "work in its process costs a step beside it; measured with two engines stepping "
                              "together (trtpd/bench/serving_probe.fit_step_cores, fit_shared_demand); 1: the engine "
                              "thread alone")
    prefill_weight: float = Field(default=1.0, gt=0, le=1, description="a prompt pass's share of the host's cores "
                                  "(a prefill instance's pass, or a colocated step that computes prompts) against a "
                                  "step that only decodes (with host_cores): threads that block often wake owed CPU "
                                  "and run first (trtpd/sim/shared_cores.py); measured with a prefill beside a "
                                  "decode batch, or a colocated prompt beside the other instance's decode, the "
                                  "decode's slowdown over the prompt's (trtpd/bench/serving_probe.fit_prefill_weight)"
                                  "; 1: equal shares")
    prefill_step_cores: float | None = Field(default=None, ge=1, description="step_cores while a prompt pass is "
                                             "in flight (with host_cores): colocated, where step_cores "
                                             "comes from two instances decoding, a prompt on one beside the other's "
                                             "decode (trtpd/bench/serving_probe.py); none: step_cores")
    prefill_compute_scale: float = Field(default=1.0, gt=0, description="the engine's prefill passes in its serving "
                                         "process (its response, KV export and watch threads beside it) take this "
                                         "multiple of the profile's, timed alone, plus prefill_pass_s: the slope of "
                                         "a line through prompts of three lengths, each pass as the engine's trace "
                                         "timed it in the server against the same pass in-process "
                                         "(trtpd/bench/serving_probe.fit_prefill_pass)")
    prefill_pass_s: float = Field(default=0.0, ge=0, description="added to every prefill pass in the serving "
                                  "process (with prefill_compute_scale, the line's intercept): disaggregated, the "
                                  "layer-wise KV export that decode pulls from during the pass")


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


MIN_STEP_FRACTION = 0.5   # a decode step with the serving costs is never shorter than half the profile's


class MeasuredPerfModel:
    """PerfModel over measured curves. Prefill: the curve at the batch's tokens, plus, when the profile has single
    prompts, the attention its long prompts add (prefill_s)."""

    def __init__(self, profile: MeasuredProfile, serving: ServingOverhead | None = None) -> None:
        self.profile = profile
        # where the numbers come from: "measured" (trtpd profile on an engine), or "measured: <backend>"
        self.source = "measured" if profile.backend == "reference" else f"measured: {profile.backend}"
        self.serving = serving or ServingOverhead()
        p = profile.prefill
        self._prefill = Curve1D(tuple(p.num_tokens), tuple(p.latency_s))
        # a prompt of n > prompt_tokens tokens costs this much beyond the same n tokens as the curve's short prompts
        self._prompt_tokens = p.prompt_tokens or 0
        self._long_prompt_extra: Curve1D | None = None
        if p.single_prompt_tokens and p.prompt_tokens:
            self._long_prompt_extra = Curve1D(
                (float(p.prompt_tokens), *map(float, p.single_prompt_tokens)),
                (0.0, *(max(0.0, s - self._prefill(n)) for n, s in zip(p.single_prompt_tokens, p.single_latency_s))))
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
        """The curve at `num_tokens`, plus the long prompts' extra, times the serving process's prefill scale, plus
        its cost per pass (ServingOverhead.prefill_pass_s). The batch is read as num_tokens / n prompts of
        n = sum_sq_tokens / num_tokens tokens each (exact for prompts of equal length; mixed batches within 17% on
        the reference engine, docs/simulator-fidelity.md). sum_sq_tokens 0 (not known): the curve alone."""
        latency = self._prefill(num_tokens)
        n = sum_sq_tokens / num_tokens if num_tokens > 0 else 0.0
        if self._long_prompt_extra is not None and n > self._prompt_tokens:
            latency += num_tokens / n * self._long_prompt_extra(n)
        pass_s = self.serving.prefill_pass_s if num_tokens > 0 else 0.0
        return latency * self.serving.prefill_compute_scale + pass_s

    def decode_step_s(self, batch_size: int, total_context_tokens: int) -> float:
        forward = self._decode(batch_size, total_context_tokens / batch_size if batch_size else 0.0)
        step = forward + self.serving.step_overhead_s + batch_size * self.serving.per_sequence_step_s
        return max(step, MIN_STEP_FRACTION * forward)
