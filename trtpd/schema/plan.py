"""The plan file: what `trtpd plan` writes and `trtpd build`, `trtpd simulate` and the controller read.

Schema `trtpd/v1`, kind `Plan` (YAML; every field is listed in configs/plans/README.md):

    api_version: trtpd/v1
    kind: Plan
    model: llama-2-70b            # catalog name
    hardware: h100-sxm            # configs/hardware/<name>.yaml
    weight_dtype: fp8             # fp8 | fp16 | bf16 | fp32
    kv_dtype: fp8                 # the same on both roles (trtpd lint checks it)
    tokens_per_block: 32          # the same on both roles
    first_token_at: decode        # where the client's first token comes from (decode: Triton BLS path)
    feasible: true
    binding_constraint: null      # ttft | tpot | gpu_budget | memory | kv_link | decode_batch | instances | target
    nearest_feasible: {}          # e.g. {rate_per_s: 41.2} or {ttft_s: 0.61}
    target: {rate_per_s: 40.0, tokens_per_min: 1.8e6}
    slo: {ttft_s: 0.5, tpot_s: 0.05, attainment: 0.9}
    workload: {name, mean_input_tokens, p99_input_tokens, max_input_tokens, mean_output_tokens,
               max_output_tokens, arrival_process, arrival_cv}
    prefill:                      # one block per role; `trtpd build` maps these to trtllm-build flags
      num_instances: 3
      tp: 1
      max_batch_size: 21
      max_num_tokens: 4096
      max_input_len: 4096
      max_seq_len: 4097           # prefill emits one token
      bucket_boundaries_tokens: [64, 256, 512, 1024, 2048]
      bucket_timeout_s: 0.005
      min_batch_size: 2
      kv_capacity_tokens: 18310
      perf_source: roofline       # or measured
    decode: {num_instances, tp, max_batch_size, max_num_tokens, max_input_len, max_seq_len,
             kv_capacity_tokens, perf_source}
    kv_transfer:
      link: network               # network | nvlink
      link_bandwidth_bytes_per_s: 8.0e10    # one decode instance's ingress
      required_bandwidth_bytes_per_s: 6.7e9 # per decode instance at the target rate (seed 000 5.3, corrected)
      link_utilization: 0.08
      kv_bytes_per_token: 163840
      mean_bytes_per_request: 8.4e7
      mean_transfer_s: 0.0011
    num_gpus: 5
    max_rate_per_s: 49.7          # highest rate this plan sustains (analytic)
    goodput_per_gpu_per_s: 9.9    # DistServe's objective
    expected: {ttft_p_s, tpot_p_s, decode_batch_mean, prefill_utilization,   # analytic, at the target,
               ttft_correction, tpot_correction}                              # scaled to the simulation
    verification: {num_requests, rate_per_s, ttft_s: {mean,p50,p90,p99}, tpot_s: {...},
                   slo_attainment, passed, ttft_breakdown_s: {...},
                   simulations: [[P, D, attainment]]}   # a trim that failed stopped once that was certain:
                                                        # its share of the requests decided by then
    seed004: {...}                # seed 004's first pass on the same performance curves, for comparison
    colocated: {num_instances, tp, policy, max_batch_size, max_num_tokens, max_input_len, max_seq_len,
                kv_capacity_tokens, perf_source}          # the best colocated configuration (optional)
    comparison:                   # colocated against disaggregated on the same data (optional)
      recommended: colocated      # or disaggregated
      ratio_per_gpu: 1.4          # simulated goodput per GPU, recommended / the other
      reasons: [...]
      disaggregated: {num_gpus, tp, num_instances, max_batch_size, max_num_tokens, goodput_rate_per_s,
                      goodput_per_gpu_per_s, static_rate_per_s, static_per_gpu_per_s, ttft_s, tpot_s, ...}
      colocated: {...}            # the same fields, plus policy
    notes: [...]
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from trtpd.perf.yaml_io import dump_yaml, load_yaml_model
from trtpd.schema.slo import Slo


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WorkloadSummary(_Strict):
    name: str
    mean_input_tokens: float
    p99_input_tokens: float
    max_input_tokens: int
    mean_output_tokens: float
    max_output_tokens: int
    arrival_process: str
    arrival_cv: float


class TargetSummary(_Strict):
    rate_per_s: float | None = None
    tokens_per_min: float | None = None


class PrefillPlan(_Strict):
    num_instances: int = Field(gt=0)
    tp: int = Field(gt=0)
    max_batch_size: int = Field(gt=0)
    max_num_tokens: int = Field(gt=0)
    max_input_len: int = Field(gt=0)
    max_seq_len: int = Field(gt=0)
    bucket_boundaries_tokens: list[int]
    bucket_timeout_s: float
    min_batch_size: int
    kv_capacity_tokens: int
    perf_source: str


class DecodePlan(_Strict):
    num_instances: int = Field(gt=0)
    tp: int = Field(gt=0)
    max_batch_size: int = Field(gt=0)
    max_num_tokens: int = Field(gt=0)
    max_input_len: int = Field(gt=0)
    max_seq_len: int = Field(gt=0)
    kv_capacity_tokens: int
    perf_source: str


class KvTransferPlan(_Strict):
    link: Literal["network", "nvlink"]
    link_bandwidth_bytes_per_s: float
    required_bandwidth_bytes_per_s: float
    link_utilization: float
    kv_bytes_per_token: int
    mean_bytes_per_request: float
    mean_transfer_s: float


class Expected(_Strict):
    ttft_p_s: float
    tpot_p_s: float
    decode_batch_mean: float
    prefill_utilization: float
    ttft_correction: float = 1.0    # simulated / analytic at the verified point; applied to the values above
    tpot_correction: float = 1.0


class Verification(_Strict):
    num_requests: int
    rate_per_s: float
    ttft_s: dict[str, float]
    tpot_s: dict[str, float]
    slo_attainment: float
    passed: bool
    ttft_breakdown_s: dict[str, float]
    simulations: list[list[float]]


class ColocatedPlan(_Strict):
    """Instances doing both phases (trtpd.sim.colocated_instance's policies)."""
    num_instances: int = Field(gt=0)
    tp: int = Field(gt=0)
    policy: Literal["inflight", "chunked", "prefill_first"]
    max_batch_size: int = Field(gt=0)
    max_num_tokens: int = Field(gt=0, description="token budget per step, decode rows included")
    max_input_len: int = Field(gt=0)
    max_seq_len: int = Field(gt=0)
    kv_capacity_tokens: int
    perf_source: str


class SideSummary(_Strict):
    """One side of the comparison, simulated at its goodput rate."""
    label: str
    num_gpus: int
    tp: dict[str, int]
    num_instances: dict[str, int]
    max_batch_size: dict[str, int]
    max_num_tokens: dict[str, int]
    policy: str | None = None
    goodput_rate_per_s: float            # simulated: the highest rate meeting the attainment
    goodput_per_gpu_per_s: float
    output_tokens_per_s_per_gpu: float
    static_rate_per_s: float             # no queueing, no KV transfer, from the same curves
    static_per_gpu_per_s: float
    ttft_s: dict[str, float] = Field(default_factory=dict)    # at the goodput rate
    tpot_s: dict[str, float] = Field(default_factory=dict)
    slo_attainment: float = 0.0
    busy_share: dict[str, float] = Field(default_factory=dict)
    meets_target: bool | None = None
    perf_source: str = "roofline"


class Comparison(_Strict):
    recommended: Literal["disaggregated", "colocated"] | None
    ratio_per_gpu: float
    reasons: list[str] = Field(default_factory=list)
    disaggregated: SideSummary | None = None
    colocated: SideSummary | None = None


class Plan(_Strict):
    api_version: Literal["trtpd/v1"] = "trtpd/v1"
    kind: Literal["Plan"] = "Plan"
    model: str
    hardware: str
    weight_dtype: str
    kv_dtype: str
    tokens_per_block: int
    first_token_at: Literal["prefill", "decode"]
    feasible: bool
    binding_constraint: str | None = None
    nearest_feasible: dict[str, float] = Field(default_factory=dict)
    target: TargetSummary
    slo: Slo
    workload: WorkloadSummary
    prefill: PrefillPlan | None = None
    decode: DecodePlan | None = None
    kv_transfer: KvTransferPlan | None = None
    num_gpus: int = 0
    max_rate_per_s: float = 0.0
    goodput_per_gpu_per_s: float = 0.0
    expected: Expected | None = None
    verification: Verification | None = None
    seed004: dict[str, float] | None = None
    colocated: ColocatedPlan | None = None
    comparison: Comparison | None = None
    rejected: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)

    def to_yaml(self) -> str:
        return dump_yaml(self.model_dump(mode="json"))

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("# trtpd plan (schema: trtpd/schema/plan.py, configs/plans/README.md)\n" + self.to_yaml())


def load_plan(path: Path) -> Plan:
    return load_yaml_model(Plan, path)
