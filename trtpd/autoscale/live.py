"""The autoscaler in the live controller: the deployment spec's policy, the roles' performance models, and
the fleet's observation built from what the gateway measured (its recent requests and /health).

The observation a window of `window_s` gives: the arrival rate (requests that finished in the window, a
steady-state stand-in for arrivals), mean prompt and output lengths, per role its instances (starting +
ready; draining apart), waiting requests (its instances' queues), and at the SLO's percentile its queue time
(prefill queue / decode queue of the TTFT breakdown), TTFT judging prefill and TPOT judging decode.

The roles' performance is the planner's model (`performance_model`) of the spec's model at each role's TP and
dtypes on a hardware profile, as `trtpd plan` and `trtpd simulate` use it:
- instances on CPUs (the reference backend, trtllm-serve's CPU twin): the reference engines' settings on
  `autoscaling.hardware`, by default `cpu-reference`;
- instances on GPUs: the spec's plan (its hardware unless `autoscaling.hardware` names another), else the
  engines' manifests (TP, weight and KV dtypes, batch and token budgets) on `autoscaling.hardware`. Without a
  plan or a named profile there is no model of those GPUs: the spec is refused (check_revision).
"""

from __future__ import annotations

from typing import Protocol

from trtpd.autoscale.core import AutoscalePolicy, Autoscaler, FleetObservation, RoleObservation, RolePerf
from trtpd.percentiles import quantile
from trtpd.schema.request_sample import RequestSample
from trtpd.schema.slo import Slo

REFERENCE_HARDWARE = "cpu-reference"


def role_perf(cluster) -> dict[str, RolePerf]:
    """The autoscaler's view of a (simulated or modelled) cluster's roles."""
    from trtpd.perf.model import InstancePerf

    p, d, link = cluster.prefill, cluster.decode, cluster.kv_link
    bytes_per_token = link.kv_bytes_per_token if link else 0
    return {"prefill": RolePerf(InstancePerf(p.perf, 1, p.kv_capacity_tokens, bytes_per_token),
                                p.scheduler.max_batch_size, p.scheduler.max_num_tokens, p.scheduler.bucket_timeout_s,
                                p.scheduler.min_batch_size),
            "decode": RolePerf(InstancePerf(d.perf, 1, d.kv_capacity_tokens, bytes_per_token),
                               d.scheduler.max_batch_size)}


def on_gpus(spec) -> bool:
    """Whether the spec's instances hold GPUs (the autoscaler's costs and budget are then GPUs, else cores)."""
    return any(spec.gpus_per_instance(r) > 0 for r in spec.role_names)


def live_policy(spec) -> AutoscalePolicy:
    a = spec.autoscaling
    roles = [r for r in spec.role_names if r in ("prefill", "decode")]
    gpus = on_gpus(spec)
    cost = {r: spec.gpus_per_instance(r) if gpus else spec.role(r).cpus_per_instance for r in roles}
    budget = a.budget_gpus if gpus else a.budget_cpus
    mins = {r: a.min.get(r, 1) for r in roles}
    maxs = {r: a.max.get(r, spec.role(r).instances) for r in roles}
    if budget is None:
        budget = sum(maxs[r] * cost[r] for r in roles)
    return AutoscalePolicy(min_instances=mins, max_instances=maxs, budget=budget, cost_per_instance=cost,
                           cooldown_s=a.cooldown_s, mode=a.mode, interval_s=a.interval_s,
                           window_s=max(3 * a.interval_s, 15.0))


WEIGHT_DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}   # a manifest's weights_dtype


def options_from_manifests(spec):
    """ClusterOptions from the prefill and decode engines' manifests (trtpd build's): TP, weight dtype (fp8 when
    quantized), KV dtype, block size, batch and token budgets."""
    from trtpd.errors import ConfigError
    from trtpd.schema.manifest import load_manifest
    from trtpd.sim.options import ClusterOptions

    m = {}
    for role in ("prefill", "decode"):
        try:
            m[role] = load_manifest(spec.engine_dir(role))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"autoscaling: no model of the {role} instances without their engines' manifest "
                              f"({spec.engine_dir(role)}: {exc}); give the spec a plan instead") from None
    p, d = m["prefill"], m["decode"]
    inputs = p.inputs
    weights = "fp8" if inputs.quantization == "fp8" else WEIGHT_DTYPES.get(inputs.weights_dtype, inputs.weights_dtype)
    return ClusterOptions(tp_prefill=p.build_config.tp_size, tp_decode=d.build_config.tp_size, weight_dtype=weights,
                          kv_dtype=str(getattr(d.build_config.kv_dtype, "value", d.build_config.kv_dtype)),
                          prefill_max_num_tokens=p.build_config.max_num_tokens,
                          prefill_max_batch_size=p.build_config.max_batch_size,
                          decode_max_batch_size=d.build_config.max_batch_size,
                          tokens_per_block=d.build_config.tokens_per_block)


def performance_model(spec):
    """(hardware profile, ClusterOptions, where they come from) that the autoscaler models the spec with (see the
    module's docstring). Raises ConfigError naming the field when there is none."""
    from pathlib import Path

    from trtpd.errors import ConfigError
    from trtpd.perf.hardware import hardware_names, load_hardware
    from trtpd.sim.cluster_specs import options_from_engines, options_from_plan

    named = spec.autoscaling.hardware

    def hardware(name: str, field: str):
        try:
            return load_hardware(name)
        except (ConfigError, OSError, ValueError) as exc:
            raise ConfigError(f"{field}: no hardware profile {name!r} ({exc})") from None
    if spec.mode != "disaggregated":
        raise ConfigError("autoscaling: the autoscaler scales prefill and decode (a disaggregated deployment)")
    if not on_gpus(spec):
        build_root = Path(spec.engine_dir("decode")).parent
        return (hardware(named or REFERENCE_HARDWARE, "autoscaling.hardware"), options_from_engines(build_root),
                f"the reference engines in {build_root}")
    if spec.plan is not None:
        from trtpd.schema.plan import load_plan
        plan = load_plan(spec.plan)
        return (hardware(named or plan.hardware, "autoscaling.hardware" if named else "plan"),
                options_from_plan(plan), f"the plan {spec.plan}")
    if named is None:
        raise ConfigError(f"autoscaling.hardware: the {spec.backend} instances run on GPUs and the spec has no plan: "
                          f"name the hardware profile the autoscaler models them on (one of "
                          f"{', '.join(n for n in hardware_names() if n != REFERENCE_HARDWARE)}, or a measured one "
                          f"from `trtpd profile`), or give the spec the plan it was sized with")
    return hardware(named, "autoscaling.hardware"), options_from_manifests(spec), "the engines' manifests"


def live_autoscaler(spec) -> Autoscaler:
    from trtpd.catalog import resolve_model
    from trtpd.sim.cluster_specs import disaggregated_cluster

    hardware, options, _ = performance_model(spec)
    return Autoscaler(live_policy(spec), role_perf(disaggregated_cluster(resolve_model(spec.model), hardware,
                                                                         options)))


class Instance(Protocol):
    """What the observation needs of a row of the controller's instance table (trtpd.controller.types.InstanceRow)."""

    role: str
    state: str


def observe(now_s: float, window_s: float, samples: list[RequestSample], health: dict | None, table: list[Instance],
            slo: Slo) -> FleetObservation:
    """`samples`: the gateway's finished requests (GET /admin/requests) of the last `window_s`; `health`: its
    /health body; `table`: the controller's instance table."""
    q = slo.attainment
    recent = [s for s in samples if s.t >= now_s - window_s]
    ok = [s for s in recent if s.ok]
    views = health["instances"] if health else []
    roles = {}
    for role in ("prefill", "decode"):
        rows = [r for r in table if r.role == role]
        queue_s = [s.prefill_queue_s if role == "prefill" else s.decode_queue_s for s in ok]
        roles[role] = RoleObservation(
            role, sum(1 for r in rows if r.state in ("starting", "ready")),
            sum(v["waiting"] for v in views if v["role"] == role), quantile(queue_s, q),
            quantile([s.ttft_s for s in ok], q) if role == "prefill" else None,
            quantile([s.tpot_s for s in ok], q) if role == "decode" else None,
            _busy(views, role), sum(1 for r in rows if r.state == "draining"))
    lengths_in = [s.num_prompt_tokens for s in ok if s.num_prompt_tokens]
    lengths_out = [s.num_tokens for s in ok if s.num_tokens]
    return FleetObservation(now_s, len(recent) / window_s, sum(lengths_in) / len(lengths_in) if lengths_in else 0.0,
                            sum(lengths_out) / len(lengths_out) if lengths_out else 0.0, roles, slo)


def _busy(views: list[dict], role: str) -> float:
    """Batch utilisation averaged over the role's instances (what /health says; 0 when unknown)."""
    values = [v["batch_utilisation"] for v in views if v["role"] == role and v.get("batch_utilisation") is not None]
    return sum(values) / len(values) if values else 0.0
