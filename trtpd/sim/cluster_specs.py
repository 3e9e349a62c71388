"""Builds a ClusterSpec from explicit options or from a plan file (for `trtpd simulate`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from trtpd.catalog import ModelSpec
from trtpd.errors import ConfigError
from trtpd.perf.hardware import HardwareProfile
from trtpd.perf.kv_link import kv_link_bytes_per_s
from trtpd.perf.model import InstancePerf, instance_perf
from trtpd.schema.plan import Plan
from trtpd.sched.continuous import BatchSchedulerConfig
from trtpd.sched.prefill import PrefillSchedulerConfig
from trtpd.sim.cluster import BatchRole, ClusterSpec, KvLinkSpec, PrefillRole
from trtpd.sim.options import ClusterOptions


def options_from_plan(plan: Plan) -> ClusterOptions:
    if plan.prefill is None or plan.decode is None or plan.kv_transfer is None:
        raise ConfigError(f"the plan has no configuration to simulate (feasible: {plan.feasible}, "
                          f"binding constraint: {plan.binding_constraint})")
    p, d, kv = plan.prefill, plan.decode, plan.kv_transfer
    c = plan.colocated   # the plan's best colocated configuration, when it has one
    colocated = {} if c is None else dict(
        colocated_policy=c.policy, tp_colocated=c.tp, num_colocated=c.num_instances,
        colocated_max_batch_size=c.max_batch_size, colocated_max_num_tokens=c.max_num_tokens)
    return ClusterOptions(**colocated,num_prefill=p.num_instances, num_decode=d.num_instances, tp_prefill=p.tp, tp_decode=d.tp,
                          weight_dtype=plan.weight_dtype, kv_dtype=plan.kv_dtype,
                          prefill_max_num_tokens=p.max_num_tokens, prefill_max_batch_size=p.max_batch_size,
                          prefill_min_batch_size=p.min_batch_size, bucket_timeout_s=p.bucket_timeout_s,
                          decode_max_batch_size=d.max_batch_size, kv_link=kv.link,
                          kv_link_bytes_per_s=kv.link_bandwidth_bytes_per_s,
                          tokens_per_block=plan.tokens_per_block, first_token_at=plan.first_token_at)


def options_from_engines(build_root: Path, base: ClusterOptions = ClusterOptions()) -> ClusterOptions:
    """Mirrors a reference build's scheduler settings and KV pools (engines/<model>/reference-<kv>/)."""
    from trtpd.engine.engine_config import EngineConfig

    cfgs = {}
    for role in ("prefill", "decode", "colocated"):
        folder = build_root / f"{role}-tp1"
        if (folder / "config.json").is_file():
            cfgs[role] = EngineConfig.load(folder)
    if "prefill" not in cfgs or "decode" not in cfgs:
        raise ConfigError(f"{build_root}: no prefill-tp1/ and decode-tp1/ engine folders; build them with "
                          f"`trtpd build --backend reference`")
    p, d = cfgs["prefill"], cfgs["decode"]
    update = dict(weight_dtype="fp32", kv_dtype=p.kv_dtype.value, tp_prefill=p.tp_size, tp_decode=d.tp_size,
                  prefill_max_num_tokens=p.max_num_tokens, prefill_max_batch_size=p.max_batch_size,
                  prefill_min_batch_size=p.min_batch_size, bucket_timeout_s=p.bucket_timeout_ms / 1e3,
                  decode_max_batch_size=d.max_batch_size, tokens_per_block=d.tokens_per_block,
                  prefill_kv_capacity_tokens=p.num_kv_blocks * p.tokens_per_block,
                  decode_kv_capacity_tokens=d.num_kv_blocks * d.tokens_per_block)
    if "colocated" in cfgs:
        c = cfgs["colocated"]
        update.update(colocated_max_batch_size=c.max_batch_size, colocated_max_num_tokens=c.max_num_tokens,
                      kv_capacity_tokens=c.num_kv_blocks * c.tokens_per_block)
    return replace(base, **update)


def _perf(model: ModelSpec, hardware: HardwareProfile, tp: int, opts: ClusterOptions,
          capacity_tokens: int | None = None, mode: str | None = None) -> InstancePerf:
    inst = instance_perf(model, hardware, tp, opts.weight_dtype, opts.kv_dtype, mode)
    capacity = capacity_tokens or opts.kv_capacity_tokens
    if capacity is not None:
        inst = replace(inst, kv_capacity_tokens=capacity)
    if inst.kv_capacity_tokens <= 0:
        raise ConfigError(f"{model.name} at TP {tp} with {opts.weight_dtype} weights does not fit in "
                          f"{hardware.name}'s memory; raise the TP or use fp8 weights")
    return inst


def disaggregated_cluster(model: ModelSpec, hardware: HardwareProfile, opts: ClusterOptions) -> ClusterSpec:
    pi = _perf(model, hardware, opts.tp_prefill, opts, opts.prefill_kv_capacity_tokens, "disaggregated")
    di = _perf(model, hardware, opts.tp_decode, opts, opts.decode_kv_capacity_tokens, "disaggregated")
    if opts.kv_link_bytes_per_s is not None:
        bw = opts.kv_link_bytes_per_s
    else:
        bw = kv_link_bytes_per_s(hardware, opts.kv_link, opts.tp_prefill, opts.tp_decode)
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
        tokens_per_block=opts.tokens_per_block, first_token_at=opts.first_token_at,
        response_latency_s=di.response_latency_s, shared_cores=di.shared_cores)


def colocated_cluster(model: ModelSpec, hardware: HardwareProfile, opts: ClusterOptions) -> ClusterSpec:
    """The baseline on the same GPUs: instances at the colocated TP (default: the decode TP) doing both phases."""
    inst = _perf(model, hardware, opts.colocated_tp, opts, mode="colocated")
    num = opts.num_colocated_instances
    batch = opts.colocated_max_batch_size or opts.decode_max_batch_size
    # room for the longest prompt next to a full decode batch (else a long prompt waits for an empty batch)
    # (chunked: the step's token budget, decode rows included)
    num_tokens = opts.colocated_max_num_tokens or opts.prefill_max_num_tokens + batch
    sched = BatchSchedulerConfig(max_batch_size=batch, max_num_tokens=max(num_tokens, batch), prefill_in_step=True)
    return ClusterSpec(mode="colocated", decode=BatchRole(num, inst.perf, inst.kv_capacity_tokens, sched),
                       tokens_per_block=opts.tokens_per_block, response_latency_s=inst.response_latency_s,
                       colocated_policy=opts.colocated_policy, shared_cores=inst.shared_cores)
