"""Per-TP role candidates: which TP degrees fit, and the engine sizes each role gets.

Prefill max_num_tokens: the longest prompt, or the batch size where prefill saturates (cost per
token within 10% of its large-batch value, DistServe's L_m) if that is larger. Decode
max_batch_size: seed 004 3.3, the largest batch whose step meets the TPOT target, within the KV
capacity under GUARANTEED_NO_EVICT (every sequence reserves prompt + output tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trtpd.catalog import ModelSpec
from trtpd.errors import TrtpdError
from trtpd.perf.hardware import HardwareProfile
from trtpd.perf.model import InstancePerf, instance_perf
from trtpd.planner.inputs import SearchSpace, Slo
from trtpd.planner.role_models import DecodeModel, PrefillModel, WorkloadStats, max_batch_for_tpot
from trtpd.sched.prefill import PrefillSchedulerConfig

SATURATION_TOLERANCE = 1.10
MAX_PREFILL_BATCH_SIZE = 256


def round_up(value: float, multiple: int) -> int:
    return int(math.ceil(value / multiple) * multiple)


@dataclass(frozen=True)
class PrefillCandidate:
    tp: int
    inst: InstancePerf
    scheduler: PrefillSchedulerConfig
    model: PrefillModel


@dataclass(frozen=True)
class DecodeCandidate:
    tp: int
    inst: InstancePerf
    max_batch_size: int
    kv_batch_limit: int
    model: DecodeModel


@dataclass(frozen=True)
class Rejected:
    role: str
    tp: int
    reason: str


def saturation_tokens(inst: InstancePerf, sq_per_token: float) -> int:
    def per_token(t: int) -> float:
        return inst.perf.prefill_s(t, int(t * sq_per_token)) / t
    floor = per_token(65536)
    t = 256
    while t < 65536 and per_token(t) > SATURATION_TOLERANCE * floor:
        t *= 2
    return t


def prefill_candidate(model: ModelSpec, hardware: HardwareProfile, tp: int, stats: WorkloadStats,
                      max_input_len: int, space: SearchSpace) -> PrefillCandidate | Rejected:
    try:
        inst = instance_perf(model, hardware, tp, space.weight_dtype, space.kv_dtype, "disaggregated")
    except TrtpdError as exc:
        return Rejected("prefill", tp, str(exc))
    if tp > hardware.max_devices_per_node:
        return Rejected("prefill", tp, f"TP {tp} spans nodes ({hardware.max_devices_per_node} devices per node)")
    sq_per_token = stats.input.mean_sq / stats.input.mean
    max_num_tokens = round_up(max(max_input_len, saturation_tokens(inst, sq_per_token)), space.tokens_per_block)
    if inst.kv_capacity_tokens < max_num_tokens:
        return Rejected("prefill", tp, f"KV capacity {inst.kv_capacity_tokens} tokens < one batch of "
                                       f"{max_num_tokens} tokens (weights leave too little memory)")
    max_batch = max(2, min(MAX_PREFILL_BATCH_SIZE, math.ceil(2 * max_num_tokens / max(1.0, stats.input.p50))))
    config = PrefillSchedulerConfig(max_num_tokens=max_num_tokens, max_batch_size=max_batch)
    pm = PrefillModel(inst, stats, max_num_tokens, config.bucket_timeout_s, config.min_batch_size)
    return PrefillCandidate(tp, inst, config, pm)


def decode_candidate(model: ModelSpec, hardware: HardwareProfile, tp: int, stats: WorkloadStats,
                     max_seq_len: int, slo: Slo, space: SearchSpace) -> DecodeCandidate | Rejected:
    try:
        inst = instance_perf(model, hardware, tp, space.weight_dtype, space.kv_dtype, "disaggregated")
    except TrtpdError as exc:
        return Rejected("decode", tp, str(exc))
    if tp > hardware.max_devices_per_node:
        return Rejected("decode", tp, f"TP {tp} spans nodes ({hardware.max_devices_per_node} devices per node)")
    if inst.kv_capacity_tokens < max_seq_len:
        return Rejected("decode", tp, f"KV capacity {inst.kv_capacity_tokens} tokens < the longest sequence "
                                      f"({max_seq_len} tokens)")
    reserved_per_seq = stats.input.mean + stats.output.mean
    kv_batch_limit = int(inst.kv_capacity_tokens // reserved_per_seq)
    probe = DecodeModel(inst, stats, max(1, kv_batch_limit))
    max_batch = max_batch_for_tpot(inst, probe.context_mean, slo.tpot_s, kv_batch_limit)
    if max_batch < 1:
        one = probe.step_s(1)
        return Rejected("decode", tp, f"TPOT: one sequence alone takes {one * 1e3:.2f} ms per step > "
                                      f"{slo.tpot_s * 1e3:.2f} ms")
    return DecodeCandidate(tp, inst, max_batch, kv_batch_limit, DecodeModel(inst, stats, max_batch))
