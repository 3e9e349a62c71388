"""The autoscaler inside the simulator: `trtpd simulate --autoscale` and benchmarks/autoscale_sim.py.

The simulator (trtpd.sim) measures what a live controller reads from the fleet (trtpd.sim.scaling.FleetMetrics)
and calls a plain Scaler callable; this adapter turns those metrics into the core's FleetObservation and asks
the same Autoscaler the live controller asks (trtpd.autoscale.live). The simulator cannot import the core
itself: the core uses the planner's models, and the planner imports the simulator. The run is compared with
the best fixed prefill/decode split within the same budget (trtpd.autoscale.fixed_splits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from trtpd.autoscale import POLICY_KEYS
from trtpd.autoscale.core import AutoscalePolicy, Autoscaler, FleetObservation, RoleObservation, ScaleDecision
from trtpd.autoscale.fixed_splits import SplitResult, best_split, measure, search_splits, splits_within, with_counts
from trtpd.autoscale.live import role_perf
from trtpd.errors import ConfigError
from trtpd.perf.yaml_io import read_yaml
from trtpd.schema.slo import Slo
from trtpd.sim.cluster import ClusterSpec
from trtpd.sim.scaling import FleetMetrics, ScalingOptions
from trtpd.sim.simulator import SimRun, default_max_in_system, simulate
from trtpd.sim.workload import RequestArrays



def load_policy(spec: str, cost_per_instance: dict[str, int], budget: int | None = None):
    """--autoscale's value: a YAML file (AutoscalePolicy's fields, or the flat POLICY_KEYS), inline
    `key=value,...`, or `default`. Defaults: cost = each role's TP (cost_per_instance), budget = `budget`
    (the CLI passes the cluster's GPUs; else 10 instances' worth), min 1, max what the budget leaves after
    the other role's minimum."""
    source = spec
    if spec == "default":
        data: dict = {}
    elif "=" in spec and not Path(spec).is_file():
        data, source = _inline(spec), "--autoscale"
    else:
        raw = read_yaml(Path(spec))
        if not isinstance(raw, dict):
            raise ConfigError(f"{spec}: expected a mapping of policy fields, got {type(raw).__name__}")
        data = _flatten(raw, spec)
    unknown = sorted(set(data) - set(POLICY_KEYS))
    if unknown:
        raise ConfigError(f"{source}: unknown policy key {', '.join(unknown)}; known: {', '.join(POLICY_KEYS)}")
    roles = ("prefill", "decode")
    try:
        cost = {r: int(data.get(f"cost_{r}", cost_per_instance[r])) for r in roles}
        total = int(data.get("budget", budget if budget is not None else 5 * (cost["prefill"] + cost["decode"])))
        low = {r: int(data.get(f"min_{r}", 1)) for r in roles}
        high = {r: int(data.get(f"max_{r}", (total - low[o] * cost[o]) // cost[r])) for r, o in zip(roles, roles[::-1])}
        scalars = {k: (str(data[k]) if k == "mode" else float(data[k])) for k in
                   ("cooldown_s", "scale_up_utilisation", "scale_down_utilisation", "mode", "interval_s",
                    "window_s", "queue_time_share") if k in data}
        return AutoscalePolicy(low, high, total, cost, **scalars)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: {exc}") from None


def _inline(spec: str) -> dict:
    data = {}
    for item in spec.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--autoscale {spec!r}: expected key=value pairs separated by commas, e.g. "
                              f"budget=10,cooldown_s=60")
        data[key.strip()] = value.strip()
    return data


def _flatten(raw: dict, source: str) -> dict:
    """A YAML policy with AutoscalePolicy's nested role fields -> the flat keys."""
    data = dict(raw)
    for nested, flat in (("min_instances", "min"), ("max_instances", "max"), ("cost_per_instance", "cost")):
        if nested in data:
            value = data.pop(nested)
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: {nested} must map prefill and decode to integers")
            data.update({f"{flat}_{role}": count for role, count in value.items()})
    return data


def fleet_observation(metrics: FleetMetrics, slo: Slo) -> FleetObservation:
    """What the simulator measured (at the SLO's percentile), as the autoscaler's input: TTFT judges prefill,
    TPOT decode, as live."""
    roles = {}
    for role, m in metrics.roles.items():
        roles[role] = RoleObservation(role, m.num_ready + m.num_starting, m.waiting_requests, m.queue_time_p_s,
                                      metrics.ttft_p_s if role == "prefill" else None,
                                      metrics.tpot_p_s if role == "decode" else None, m.busy_share,
                                      m.num_draining)
    return FleetObservation(metrics.now_s, metrics.arrival_rate_per_s, metrics.mean_input_tokens,
                            metrics.mean_output_tokens, roles, slo)


class SimAutoscaler:
    """A trtpd.sim.scaling.Scaler that asks the controller's Autoscaler; keeps every decision."""

    def __init__(self, autoscaler: Autoscaler, slo: Slo) -> None:
        self.autoscaler = autoscaler
        self.slo = slo
        self.decisions: list[ScaleDecision] = []

    def __call__(self, metrics: FleetMetrics) -> dict[str, int] | None:
        decision = self.autoscaler.decide(fleet_observation(metrics, self.slo))
        self.decisions.append(decision)
        return decision.counts if decision.applied else None


@dataclass
class AutoscaleComparison:
    autoscaled: SplitResult            # of the autoscaled run (its starting counts)
    best_fixed: SplitResult
    fixed: list[SplitResult] = field(default_factory=list)   # the fixed splits simulated
    num_splits: int = 0                               # the fixed splits within the budget
    decisions: list[ScaleDecision] = field(default_factory=list)    # every call
    run: SimRun | None = None          # the autoscaled run


def compare_autoscaled(cluster: ClusterSpec, requests: RequestArrays, policy: AutoscalePolicy, slo: Slo,
                       startup_s: float = 30.0, start: tuple[int, int] | None = None,
                       exhaustive: bool = False) -> AutoscaleComparison:
    """The best fixed split within the policy's budget and limits, then the autoscaled run starting from
    `start` (default: that best split, so an autoscaler that never acts scores exactly the best fixed one)."""
    splits = splits_within(policy.budget, policy.cost_per_instance, policy.min_instances, policy.max_instances)
    fixed = search_splits(cluster, requests, splits, slo.ttft_s, slo.tpot_s, exhaustive)
    best = best_split(fixed)
    num_p, num_d = start or (best.num_prefill, best.num_decode)
    scaler = SimAutoscaler(Autoscaler(policy, role_perf(cluster)), slo)
    scaling = ScalingOptions(policy.interval_s, policy.window_s, startup_s, quantile=slo.attainment)
    biggest = with_counts(cluster, policy.max_instances["prefill"], policy.max_instances["decode"])
    run = simulate(with_counts(cluster, num_p, num_d), requests, max_in_system=default_max_in_system(biggest),
                   scaler=scaler, scaling=scaling)
    return AutoscaleComparison(measure(run, num_p, num_d, slo.ttft_s, slo.tpot_s), best, fixed, len(splits),
                               scaler.decisions, run)


def timeline_text(decisions: list, mode: str) -> str:
    changes = [d for d in decisions if d.changed]
    note = "" if mode == "act" else " (observe mode: computed, not applied)"
    lines = [f"  timeline{note}: {len(changes)} decisions changed a count, of {len(decisions)}"]
    for d in changes:
        before = {r: d.changed[r][0] if r in d.changed else n for r, n in d.counts.items()}
        why = " | ".join(f"{r}: {d.reasons[r]}" for r in d.changed)
        lines.append(f"  {d.now_s:8.1f} s  {_split_label(before)} -> {_split_label(d.counts):<8} {why}")
    return "\n".join(lines)


def _split_label(counts: dict) -> str:
    return f"{counts.get('prefill', 0)}P{counts.get('decode', 0)}D"


def comparison_text(result: AutoscaleComparison) -> str:
    head = f"  {'':<22} {'attainment':>10} {'goodput/s':>10} {'instance-s':>11} {'TTFT P90':>10} {'TPOT P90':>10}"
    rows = [head]
    for label, r in ((f"autoscaled (from {result.autoscaled.label})", result.autoscaled),
                     (f"best fixed {result.best_fixed.label}", result.best_fixed)):
        s = r.summary
        goodput = s.goodput_per_s if s.goodput_per_s is not None and math.isfinite(s.goodput_per_s) else 0.0
        rows.append(f"  {label:<22} {r.attainment:>10.1%} {goodput:>10.2f} {r.instance_s:>11.0f} "
                    f"{s.ttft_s.p90 * 1e3:>8.0f}ms {s.tpot_s.p90 * 1e3:>8.1f}ms"
                    + (f"  ({s.num_unfinished} unfinished)" if s.num_unfinished else ""))
    return "\n".join(rows)
