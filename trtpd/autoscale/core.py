"""The autoscaler's decision core: observations of the fleet in, target instance counts per role out. Pure.

No I/O, no clock, no threads: the clock is `obs.now_s`, so the live controller, the simulator and the tests
run the same core. The only state is each role's last change (for the cooldown).

One decision, per role:
1. Demand through the planner's performance models (trtpd.planner.role_models), at the observed arrival
   rate and mean lengths: prefill: the highest rate one instance sustains with its queueing wait and its own
   batch (plus one decode step, the decode side's share) within the TTFT SLO, as the planner sizes prefill;
   decode: the largest batch whose step meets the TPOT SLO (within KV and the scheduler's cap), and the
   highest rate whose Little's-law batch (with its tail at the SLO's attainment) stays within it. needed = rate / per-instance rate.
   Like the planner's verified correction (and Dynamo's planner), each role's predicted latency is scaled by
   a correction learnt online: observed / predicted latency (at the SLO's percentile) at the current count, updated only while the
   role has not changed for max(window_s, cooldown_s) (a geometric mean of the old factor and the new ratio,
   kept within [1/4, 4]).
2. Hysteresis on utilisation = needed / instances: up when above scale_up_utilisation (to the fewest
   instances under it), down only when one instance fewer (or more fewer) stays below scale_down_utilisation.
3. Reactive corrections: a role whose SLO is breached (prefill: TTFT over the SLO; decode: TPOT over the SLO;
   either: its queue time over queue_time_share of the TTFT SLO; each at the SLO's percentile) gets one more
   instance, whatever the model says; a role with waiting requests never scales down.
4. Clamps to [min, max]; cooldown: a role changed less than cooldown_s ago keeps its count. In observe mode a
   decision that would change a role starts its cooldown as in act mode, so that, observation for
   observation, observe mode decides what act mode would (only `applied` differs).
5. Budget: when the wanted counts cost more than the budget, it is split by the roles' demand shares
   (never below min); an increase waits while draining instances still hold the devices it needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from trtpd.perf.model import InstancePerf
from trtpd.planner.estimate import bisect_max
from trtpd.planner.role_models import DecodeModel, LengthStats, PrefillModel, WorkloadStats, max_batch_for_tpot
from trtpd.schema.slo import Slo

SCALED_ROLES = ("prefill", "decode")
CORRECTION_RANGE = (0.25, 4.0)


@dataclass(frozen=True)
class AutoscalePolicy:
    min_instances: dict[str, int]
    max_instances: dict[str, int]
    budget: int                                   # total cost units (GPUs, cores) the roles may hold
    cost_per_instance: dict[str, int]
    cooldown_s: float = 60.0                      # after a change of a role, none of that role for this long
    scale_up_utilisation: float = 0.85
    scale_down_utilisation: float = 0.5
    mode: Literal["observe", "act"] = "act"       # observe: decisions are returned, never applied (same decisions)
    interval_s: float = 10.0                      # how often the caller asks
    window_s: float = 30.0                        # how much history the caller's rates and percentiles cover
    queue_time_share: float = 0.5                 # a queue time (SLO percentile) over this share of the TTFT SLO: breach

    def __post_init__(self) -> None:
        roles = set(self.min_instances)
        if roles != set(self.max_instances) or roles != set(self.cost_per_instance) or not roles:
            raise ValueError(f"min_instances, max_instances and cost_per_instance must name the same roles; got "
                             f"{sorted(self.min_instances)}, {sorted(self.max_instances)}, "
                             f"{sorted(self.cost_per_instance)}")
        for role in roles:
            if role not in SCALED_ROLES:
                raise ValueError(f"role {role!r}: the autoscaler scales {' and '.join(SCALED_ROLES)}")
            if not 1 <= self.min_instances[role] <= self.max_instances[role]:
                raise ValueError(f"{role}: need 1 <= min_instances ({self.min_instances[role]}) <= max_instances "
                                 f"({self.max_instances[role]})")
            if self.cost_per_instance[role] < 1:
                raise ValueError(f"{role}: cost_per_instance must be at least 1")
        floor = sum(self.min_instances[r] * self.cost_per_instance[r] for r in roles)
        if self.budget < floor:
            raise ValueError(f"budget {self.budget} is below what the minimum counts cost ({floor})")
        if not 0 < self.scale_down_utilisation < self.scale_up_utilisation <= 1:
            raise ValueError(f"need 0 < scale_down_utilisation ({self.scale_down_utilisation}) < "
                             f"scale_up_utilisation ({self.scale_up_utilisation}) <= 1")
        if self.mode not in ("observe", "act"):
            raise ValueError(f"mode {self.mode!r}: expected observe or act")
        if self.cooldown_s < 0 or self.interval_s <= 0 or self.window_s <= 0:
            raise ValueError("cooldown_s must be >= 0, interval_s and window_s positive")

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(r for r in SCALED_ROLES if r in self.min_instances)


@dataclass(frozen=True)
class RolePerf:
    """One instance of a role as the planner models it: its curves and its scheduler's limits."""

    inst: InstancePerf
    max_batch_size: int                 # decode: sequences per step; prefill: requests per batch
    max_num_tokens: int = 8192          # prefill: tokens per batch
    bucket_timeout_s: float = 0.005     # prefill
    min_batch_size: int = 1             # prefill


@dataclass(frozen=True)
class RoleObservation:
    role: str
    num_instances: int                  # starting + ready (what a target counts); draining ones not
    waiting_requests: int               # queued at its instances, not yet in a batch
    queue_time_p_s: float | None        # each latency at the SLO's percentile (its attainment: 0.9 -> P90)
    ttft_p_s: float | None              # the gateway's, on the role judged by TTFT (prefill); else None
    tpot_p_s: float | None              # the gateway's, on the role judged by TPOT (decode); else None
    busy_share: float
    num_draining: int = 0               # still holding their devices until their work is done


@dataclass(frozen=True)
class FleetObservation:
    now_s: float
    arrival_rate_per_s: float
    mean_input_tokens: float
    mean_output_tokens: float
    roles: dict[str, RoleObservation]
    slo: Slo                            # the targets, and the percentile every latency above is taken at


@dataclass(frozen=True)
class ScaleDecision:
    now_s: float
    counts: dict[str, int]                        # target per role
    changed: dict[str, tuple[int, int]]           # role: (before, after), only roles whose target differs
    reasons: dict[str, str]
    applied: bool                                 # False in observe mode or when nothing changed
    needed: dict[str, float] = field(default_factory=dict)   # the model's instances per role (fractional)


class Autoscaler:
    def __init__(self, policy: AutoscalePolicy, perf: dict[str, RolePerf]) -> None:
        missing = [r for r in policy.roles if r not in perf]
        if missing:
            raise ValueError(f"no performance model for {', '.join(missing)}")
        self.policy = policy
        self.perf = perf
        self.last_change_s: dict[str, float] = {}
        self.correction: dict[str, float] = {role: 1.0 for role in policy.roles}

    # -- the model ---------------------------------------------------------------------------------
    def _stats(self, obs: FleetObservation) -> WorkloadStats:
        return WorkloadStats(_fixed(obs.mean_input_tokens), _fixed(max(obs.mean_output_tokens, 1.0)))

    def _prefill_model(self, obs: FleetObservation) -> PrefillModel:
        perf = self.perf["prefill"]
        return PrefillModel(perf.inst, self._stats(obs), perf.max_num_tokens, perf.bucket_timeout_s,
                            perf.min_batch_size)

    def _decode_model(self, obs: FleetObservation, correction: float) -> DecodeModel | None:
        """At the largest batch whose (corrected) step meets the TPOT SLO, within KV and the scheduler's cap
        (None if even one sequence misses it)."""
        perf, stats = self.perf["decode"], self._stats(obs)
        kv_limit = int(perf.inst.kv_capacity_tokens // (obs.mean_input_tokens + obs.mean_output_tokens))
        context = DecodeModel(perf.inst, stats, 1).context_mean
        tpot_s = obs.slo.tpot_s / correction
        batch = min(perf.max_batch_size, max_batch_for_tpot(perf.inst, context, tpot_s, kv_limit))
        return DecodeModel(perf.inst, stats, batch) if batch >= 1 else None

    def predicted_p_s(self, role: str, obs: FleetObservation, rate_per_s: float) -> float:
        """The model's latency at one instance's rate and the SLO's percentile, uncorrected: prefill: TTFT
        (with one decode step); decode: TPOT."""
        p = obs.slo.attainment
        if role == "prefill":
            return sum(self._prefill_model(obs).ttft_parts_s(rate_per_s, p)) + obs.slo.tpot_s
        model = self._decode_model(obs, 1.0)
        return model.tail(rate_per_s, p)[1] if model is not None else math.inf

    def rate_per_instance(self, role: str, obs: FleetObservation) -> float:
        """Requests/s one instance of `role` sustains within the SLO at the observed mean lengths."""
        p, correction = obs.slo.attainment, self.correction.get(role, 1.0)
        if role == "prefill":
            model = self._prefill_model(obs)
            return bisect_max(lambda rate: (sum(model.ttft_parts_s(rate, p)) + obs.slo.tpot_s) * correction
                              <= obs.slo.ttft_s, model.capacity_per_s())
        decode = self._decode_model(obs, correction)
        if decode is None:
            return 0.0

        def ok(rate: float) -> bool:
            batch_p, tpot_p = decode.tail(rate, p)
            return batch_p <= decode.max_batch_size and tpot_p * correction <= obs.slo.tpot_s
        return bisect_max(ok, decode.max_batch_size / (decode.steps_mean * decode.step_s(1.0)))

    def calibrate(self, obs: FleetObservation) -> None:
        """Learns each role's correction (observed / predicted, at the SLO's percentile) while the role is settled."""
        settle_s = max(self.policy.window_s, self.policy.cooldown_s)
        if obs.arrival_rate_per_s <= 0 or obs.mean_input_tokens <= 0:
            return
        for role in self.policy.roles:
            ro = obs.roles[role]
            observed = ro.ttft_p_s if role == "prefill" else ro.tpot_p_s
            if observed is None or ro.num_instances < 1 or ro.num_draining:
                continue
            if obs.now_s - self.last_change_s.get(role, -math.inf) < settle_s:
                continue
            if role == "prefill" and self._queue_breach("decode", obs):
                continue      # the TTFT is the decode queue's, not the model's
            predicted = self.predicted_p_s(role, obs, obs.arrival_rate_per_s / ro.num_instances)
            if not 0 < predicted < math.inf:
                continue
            low, high = CORRECTION_RANGE
            ratio = min(high, max(low, observed / predicted))
            self.correction[role] = min(high, max(low, math.sqrt(self.correction[role] * ratio)))

    def needed(self, obs: FleetObservation) -> dict[str, float]:
        """Instances (fractional) each role needs for the observed rate; inf where one cannot meet the SLO."""
        if obs.arrival_rate_per_s <= 0 or obs.mean_input_tokens <= 0:
            return {role: 0.0 for role in self.policy.roles}
        out = {}
        for role in self.policy.roles:
            rate = self.rate_per_instance(role, obs)
            out[role] = obs.arrival_rate_per_s / rate if rate > 0 else math.inf
        return out

    # -- the decision ------------------------------------------------------------------------------
    def decide(self, obs: FleetObservation) -> ScaleDecision:
        policy = self.policy
        missing = [r for r in policy.roles if r not in obs.roles]
        if missing:
            raise ValueError(f"the observation has no {', '.join(missing)} role")
        self.calibrate(obs)
        needed = self.needed(obs)
        current = {r: obs.roles[r].num_instances for r in policy.roles}
        wanted, reasons = {}, {}
        for role in policy.roles:
            wanted[role], reasons[role] = self._wanted(role, needed[role], obs)
        frozen = set()
        for role in policy.roles:
            since = obs.now_s - self.last_change_s.get(role, -math.inf)
            if wanted[role] != current[role] and since < policy.cooldown_s:
                reasons[role] += (f"; held at {current[role]} by the cooldown (changed {since:.0f} s ago, "
                                  f"{policy.cooldown_s:.0f} s)")
                wanted[role] = current[role]
                frozen.add(role)
        floors = {r: min(wanted[r], current[r]) if obs.roles[r].waiting_requests else policy.min_instances[r]
                  for r in policy.roles}
        counts = self._within_budget(wanted, needed, frozen, floors, reasons)
        counts = self._within_held(counts, current, obs, reasons)
        changed = {r: (current[r], counts[r]) for r in policy.roles if counts[r] != current[r]}
        applied = policy.mode == "act" and bool(changed)
        for role in changed:     # observe mode too: its cooldown and calibration follow act mode's
            self.last_change_s[role] = obs.now_s
        return ScaleDecision(obs.now_s, counts, changed, reasons, applied, needed)

    def _wanted(self, role: str, needed: float, obs: FleetObservation) -> tuple[int, str]:
        policy, ro = self.policy, obs.roles[role]
        n = ro.num_instances
        up, down = policy.scale_up_utilisation, policy.scale_down_utilisation
        utilisation = needed / n if n else math.inf
        model = f"model {needed:.2f} instances ({utilisation:.0%} of {n}"
        correction = self.correction.get(role, 1.0)
        model += f", latency x{correction:.2f})" if correction != 1.0 else ")"
        breach = self._breach(role, obs)
        if utilisation > up:
            want = math.ceil(needed / up - 1e-9) if math.isfinite(needed) else policy.max_instances[role]
            reason = f"{model} > {up:.0%}: up to {want}"
            if breach:
                want = max(want, n + 1)
                reason += f"; {breach}"
        elif breach:
            want, reason = n + 1, f"{breach}: +1 ({model})"
        else:
            fewest = math.floor(needed / down) + 1       # the fewest instances with utilisation below `down`
            if fewest < n and ro.waiting_requests:
                want, reason = n, f"{model}; no scale-down while {ro.waiting_requests} requests wait"
            elif fewest < n:
                want, reason = fewest, f"{model}; {needed / fewest:.0%} of {fewest} < {down:.0%}: down to {fewest}"
            else:
                want, reason = n, model
        low, high = policy.min_instances[role], policy.max_instances[role]
        if not low <= want <= high:
            clamped = min(high, max(low, want))
            reason += f"; clamped to {clamped} (min {low}, max {high})"
            want = clamped
        return want, reason

    def _queue_breach(self, role: str, obs: FleetObservation) -> bool:
        ro = obs.roles.get(role)
        limit_s = self.policy.queue_time_share * obs.slo.ttft_s
        return ro is not None and ro.queue_time_p_s is not None and ro.queue_time_p_s > limit_s

    def _breach(self, role: str, obs: FleetObservation) -> str:
        """Why the role's SLO is breached now ('' if it is not)."""
        ro, slo, queue_limit_s = obs.roles[role], obs.slo, self.policy.queue_time_share * obs.slo.ttft_s
        p = f"P{slo.attainment * 100:g}"
        if self._queue_breach(role, obs):
            return f"queue time {p} {ro.queue_time_p_s:.3g} s > {queue_limit_s:.3g} s"
        if ro.ttft_p_s is not None and ro.ttft_p_s > slo.ttft_s:
            if not any(self._queue_breach(r, obs) for r in obs.roles if r != role):
                # (a TTFT breach another role's queue explains is that role's)
                return f"TTFT {p} {ro.ttft_p_s:.3g} s > SLO {slo.ttft_s:.3g} s"
        if ro.tpot_p_s is not None and ro.tpot_p_s > slo.tpot_s:
            return f"TPOT {p} {ro.tpot_p_s * 1e3:.3g} ms > SLO {slo.tpot_s * 1e3:.3g} ms"
        return ""

    def _within_budget(self, wanted: dict[str, int], needed: dict[str, float], frozen: set[str],
                       floors: dict[str, int], reasons: dict[str, str]) -> dict[str, int]:
        """The wanted counts, or when they cost more than the budget, the budget split by demand shares
        (never below a role's floor: its minimum, or its current count while requests wait)."""
        policy, cost = self.policy, self.policy.cost_per_instance
        total = sum(wanted[r] * cost[r] for r in policy.roles)
        if total <= policy.budget:
            return dict(wanted)
        free = [r for r in policy.roles if r not in frozen]
        left = policy.budget - sum(wanted[r] * cost[r] for r in frozen)
        demand = {r: (needed[r] if math.isfinite(needed[r]) else wanted[r]) * cost[r] for r in free}
        total_demand = sum(demand.values()) or 1.0
        counts = dict(wanted)
        for r in free:
            share = left * demand[r] / total_demand
            counts[r] = min(wanted[r], max(floors[r], math.floor(share / cost[r])))
        while True:   # what the floors left over goes to the most utilised role that still fits
            spare = left - sum(counts[r] * cost[r] for r in free)
            takers = [r for r in free if counts[r] < wanted[r] and cost[r] <= spare]
            if not takers:
                break
            counts[max(takers, key=lambda r: (needed[r] / counts[r], r))] += 1
        shares = ", ".join(f"{r} {demand[r] / total_demand:.0%}" for r in free)
        wanted_text = " + ".join(f"{wanted[r]} {r}" for r in policy.roles)
        for r in policy.roles:
            reasons[r] += (f"; budget: wanted {wanted_text} = {total} > {policy.budget}, "
                           f"split by demand ({shares}): {counts[r]}")
        return counts

    def _within_held(self, counts: dict[str, int], current: dict[str, int], obs: FleetObservation,
                     reasons: dict[str, str]) -> dict[str, int]:
        """Increases only as far as the budget is free now (draining instances still hold their devices)."""
        policy, cost = self.policy, self.policy.cost_per_instance
        held = sum((max(current[r], counts[r]) + obs.roles[r].num_draining) * cost[r] for r in policy.roles)
        if held <= policy.budget:
            return counts
        out = dict(counts)
        free = policy.budget - sum((current[r] + obs.roles[r].num_draining) * cost[r] for r in policy.roles)
        for r in sorted((r for r in policy.roles if counts[r] > current[r]), key=lambda r: -counts[r] + current[r]):
            step = max(0, min(counts[r] - current[r], free // cost[r]))
            out[r] = current[r] + step
            free -= step * cost[r]
            if out[r] < counts[r]:
                reasons[r] += f"; {counts[r] - out[r]} more wait for draining instances to free the budget"
        return out


def _fixed(mean_tokens: float) -> LengthStats:
    """The length distribution the models get: the observed mean (the caller's window has no more)."""
    t = max(mean_tokens, 1.0)
    return LengthStats(t, t * t, t, t, t, t)
