"""The performance-model interface and the choice between measured curves and the roofline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from trtpd.catalog import KvDtype, ModelSpec
from trtpd.perf.hardware import HardwareProfile
from trtpd.perf.measured import MeasuredPerfModel
from trtpd.perf.roofline import RooflinePerfModel


class PerfModel(Protocol):
    source: str

    def prefill_s(self, num_tokens: int, sum_sq_tokens: int | None = None) -> float:
        """Latency of one prefill batch of num_tokens packed prompt tokens."""

    def decode_step_s(self, batch_size: int, total_context_tokens: int) -> float:
        """Latency of one decode step over batch_size sequences holding total_context_tokens of KV."""


@dataclass(frozen=True)
class SharedCoresSpec:
    """The host's cores the instances share with the serving path (CPU profiles measured with --serving; the
    simulator's processor sharing is trtpd/sim/shared_cores.py)."""

    cores: int                            # the cores the deployment's processes run on
    serving_cpu_per_token_s: float = 0.0  # the cores' seconds the serving path takes from the engines per token
    step_cores: float = 1.0               # the host's cores a step in flight takes as the other engines feel it
    prefill_weight: float = 1.0           # a prompt pass's share of the cores against a step that only decodes
    prefill_step_cores: float | None = None   # step_cores while a prompt pass is in flight (None: step_cores)
    serving_cpu_per_request_s: float = 0.0     # the serving path's CPU per request beyond its tokens (a job)

    def __post_init__(self) -> None:
        if self.cores < 1:
            raise ValueError(f"shared cores: cores must be at least 1, got {self.cores}")
        if self.serving_cpu_per_token_s < 0:
            raise ValueError(f"shared cores: serving_cpu_per_token_s must be >= 0, got {self.serving_cpu_per_token_s}")
        if self.step_cores < 1:
            raise ValueError(f"shared cores: step_cores must be at least 1 (one engine thread), got {self.step_cores}")
        if not 0 < self.prefill_weight <= 1:
            raise ValueError(f"shared cores: prefill_weight must be in (0, 1], got {self.prefill_weight}")
        if self.serving_cpu_per_request_s < 0:
            raise ValueError(f"shared cores: serving_cpu_per_request_s must be >= 0, got "
                             f"{self.serving_cpu_per_request_s}")
        if self.prefill_step_cores is not None and self.prefill_step_cores < 1:
            raise ValueError(f"shared cores: prefill_step_cores must be at least 1, got {self.prefill_step_cores}")


@dataclass(frozen=True)
class InstancePerf:
    """What the planner and the simulator need about one instance of a role."""

    perf: PerfModel
    tp: int
    kv_capacity_tokens: int
    kv_bytes_per_token: int  # whole request (all TP shards), in the KV dtype: what crosses the link
    response_latency_s: float = 0.0   # measured serving path latency (reference profiles with --serving)
    shared_cores: SharedCoresSpec | None = None   # the host's cores the instances share (measured; CPU only)

    @property
    def source(self) -> str:
        return self.perf.source


def instance_perf(model: ModelSpec, hardware: HardwareProfile, tp: int = 1, weight_dtype: str = "fp16",
                  kv_dtype: KvDtype | str = KvDtype.FP16, mode: str | None = None) -> InstancePerf:
    """Measured curves when the hardware profile has them for this model, TP and KV dtype; else roofline.
    `mode` (disaggregated or colocated) picks the measured serving overhead, if the profile has one."""
    kv = KvDtype.parse(kv_dtype)
    roofline = RooflinePerfModel(model, hardware, tp, weight_dtype, kv)
    measured = hardware.find_measured(model.name, tp, kv.value)
    if measured is None:
        return InstancePerf(roofline, tp, roofline.kv_capacity_tokens, model.kv_bytes_per_token(kv))
    capacity = measured.kv_capacity_tokens or roofline.kv_capacity_tokens
    serving = measured.serving.get(mode) if mode else None
    shared = SharedCoresSpec(serving.host_cores, serving.serving_cpu_per_token_s, serving.step_cores,
                             serving.prefill_weight, serving.prefill_step_cores,
                             serving.serving_cpu_per_request_s) \
        if serving is not None and serving.host_cores else None
    return InstancePerf(MeasuredPerfModel(measured, serving), tp, capacity, model.kv_bytes_per_token(kv),
                        serving.response_latency_s if serving else 0.0, shared)
