"""The autoscaler in the live controller: the deployment spec's policy, the roles' performance models, and
the fleet's observation built from what the gateway measured (its recent requests and /health).

The observation a window of `window_s` gives: the arrival rate (requests that finished in the window, a
steady-state stand-in for arrivals), mean prompt and output lengths, per role its instances (starting +
ready; draining apart), waiting requests (its instances' queues), and at the SLO's percentile its queue time
(prefill queue / decode queue of the TTFT breakdown), TTFT judging prefill and TPOT judging decode. The roles'
performance comes from the planner's models of the engines on the `cpu-reference` hardware profile (the
reference backend) or the spec's hardware (GPU path), as `trtpd simulate` uses them.
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


def live_policy(spec) -> AutoscalePolicy:
    a = spec.autoscaling
    roles = [r for r in spec.role_names if r in ("prefill", "decode")]
    cost = {r: spec.role(r).cpus_per_instance if spec.backend == "reference" else spec.gpus_per_instance(r)
            for r in roles}
    budget = a.budget_cpus if spec.backend == "reference" else a.budget_gpus
    mins = {r: a.min.get(r, 1) for r in roles}
    maxs = {r: a.max.get(r, spec.role(r).instances) for r in roles}
    if budget is None:
        budget = sum(maxs[r] * cost[r] for r in roles)
    return AutoscalePolicy(min_instances=mins, max_instances=maxs, budget=budget, cost_per_instance=cost,
                           cooldown_s=a.cooldown_s, mode=a.mode, interval_s=a.interval_s,
                           window_s=max(3 * a.interval_s, 15.0))


def live_autoscaler(spec) -> Autoscaler:
    from pathlib import Path

    from trtpd.catalog import resolve_model
    from trtpd.perf.hardware import load_hardware
    from trtpd.sim.cluster_specs import disaggregated_cluster, options_from_engines

    if spec.mode != "disaggregated":
        raise ValueError("the autoscaler scales prefill and decode (a disaggregated deployment)")
    build_root = Path(spec.engine_dir("decode")).parent
    cluster = disaggregated_cluster(resolve_model(spec.model), load_hardware(REFERENCE_HARDWARE),
                                    options_from_engines(build_root))
    return Autoscaler(live_policy(spec), role_perf(cluster))


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
