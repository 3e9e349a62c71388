"""Builds a ClusterSpec from explicit options or from a plan file (for `trtpd simulate`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from trtpd.catalog import ModelSpec
from trtpd.errors import ConfigError
from trtpd.perf.hardware import HardwareProfile
from trtpd.perf.model import InstancePerf, instance_perf
from trtpd.planner.plan import Plan
from trtpd.sched.continuous import BatchSchedulerConfig
from trtpd.sched.prefill import PrefillSchedulerConfig
from trtpd.sim.cluster import BatchRole, ClusterSpec, KvLinkSpec, PrefillRole


@dataclass(frozen=True)
class ClusterOptions:
    num_prefill: int = 1
    num_decode: int = 1
    tp_prefill: int = 1
    tp_decode: int = 1
    weight_dtype: str = "fp16"
    kv_dtype: str = "fp16"
    prefill_max_num_tokens: int = 8192
    prefill_max_batch_size: int = 8
    prefill_min_batch_size: int = 2
    bucket_timeout_s: float = 0.005
    decode_max_batch_size: int = 64
    kv_link: Literal["network", "nvlink"] = "network"
    kv_link_bytes_per_s: float | None = None     # one decode instance's ingress; default from the hardware
    kv_link_latency_s: float = 50e-6
    kv_capacity_tokens: int | None = None        # per instance; default from the perf model
    tokens_per_block: int = 32
    first_token_at: Literal["prefill", "decode"] = "decode"
    num_colocated: int | None = None             # default: as many TP-decode instances as the P/D pair's GPUs

    @property
    def num_gpus(self) -> int:
        return self.num_prefill * self.tp_prefill + self.num_decode * self.tp_decode


def options_from_plan(plan: Plan) -> ClusterOptions:
    if plan.prefill is None or plan.decode is None or plan.kv_transfer is None:
        raise ConfigError(f"the plan has no configuration to simulate (feasible: {plan.feasible}, "
                          f"binding constraint: {plan.binding_constraint})")
    p, d, kv = plan.prefill, plan.decode, plan.kv_transfer
    return ClusterOptions(num_prefill=p.num_instances, num_decode=d.num_instances, tp_prefill=p.tp, tp_decode=d.tp,
                          weight_dtype=plan.weight_dtype, kv_dtype=plan.kv_dtype,
                          prefill_max_num_tokens=p.max_num_tokens, prefill_max_batch_size=p.max_batch_size,
                          prefill_min_batch_size=p.min_batch_size, bucket_timeout_s=p.bucket_timeout_s,
                          decode_max_batch_size=d.max_batch_size, kv_link=kv.link,
                          kv_link_bytes_per_s=kv.link_bandwidth_bytes_per_s,
                          tokens_per_block=plan.tokens_per_block, first_token_at=plan.first_token_at)


def _perf(model: ModelSpec, hardware: HardwareProfile, tp: int, opts: ClusterOptions) -> InstancePerf:
    inst = instance_perf(model, hardware, tp, opts.weight_dtype, opts.kv_dtype)
    if opts.kv_capacity_tokens is not None:
        inst = replace(inst, kv_capacity_tokens=opts.kv_capacity_tokens)
    if inst.kv_capacity_tokens <= 0:
        raise ConfigError(f"{model.name} at TP {tp} with {opts.weight_dtype} weights does not fit in "
                          f"{hardware.name}'s memory; raise the TP or use fp8 weights")
    return inst


def disaggregated_cluster(model: ModelSpec, hardware: HardwareProfile, opts: ClusterOptions) -> ClusterSpec:
    pi, di = _perf(model, hardware, opts.tp_prefill, opts), _perf(model, hardware, opts.tp_decode, opts)
    if opts.kv_link_bytes_per_s is not None:
        bw = opts.kv_link_bytes_per_s
    else:
        per_device = (hardware.nvlink_bandwidth_bytes_per_s if opts.kv_link == "nvlink"
                      else hardware.network_bandwidth_bytes_per_s)
        bw = per_device * min(opts.tp_prefill, opts.tp_decode) * hardware.link_efficiency
    if bw <= 0:
        raise ConfigError(f"hardware {hardware.name!r} has no {opts.kv_link} bandwidth; use --kv-link network "
                          f"or --kv-link-bytes-per-s")
    prefill_sched = PrefillSchedulerConfig(bucket_timeout_s=opts.bucket_timeout_s,
                                           min_batch_size=min(opts.prefill_min_batch_size, opts.prefill_max_batch_size),
                                           max_batch_size=opts.prefill_max_batch_size,
                                           max_num_tokens=opts.prefill_max_num_tokens)
    decode_sched = BatchSchedulerConfig(max_batch_size=opts.decode_max_batch_size,
                                        max_num_tokens=opts.decode_max_batch_size)
    return ClusterSpec(
        mode="disaggregated",
        prefill=PrefillRole(opts.num_prefill, pi.perf, pi.kv_capacity_tokens, prefill_sched),
        decode=BatchRole(opts.num_decode, di.perf, di.kv_capacity_tokens, decode_sched),
        kv_link=KvLinkSpec(bw, opts.kv_link_latency_s, di.kv_bytes_per_token),
        tokens_per_block=opts.tokens_per_block, first_token_at=opts.first_token_at)


def colocated_cluster(model: ModelSpec, hardware: HardwareProfile, opts: ClusterOptions) -> ClusterSpec:
    """The baseline on the same GPUs: instances at the decode TP doing both phases."""
    inst = _perf(model, hardware, opts.tp_decode, opts)
    num = opts.num_colocated or max(1, opts.num_gpus // opts.tp_decode)
    sched = BatchSchedulerConfig(max_batch_size=opts.decode_max_batch_size,
                                 max_num_tokens=max(opts.prefill_max_num_tokens, opts.decode_max_batch_size),
                                 prefill_in_step=True)
    return ClusterSpec(mode="colocated", decode=BatchRole(num, inst.perf, inst.kv_capacity_tokens, sched),
                       tokens_per_block=opts.tokens_per_block)
