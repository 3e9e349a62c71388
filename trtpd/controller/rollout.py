"""The rollout core: a revision's way from canary to promoted, or back. Pure: the caller passes the instance
table, the gate's samples and the clock; it gets the next rollout state, the instances wanted per
(role, revision) and the traffic split.

Phases:
- canary: the stable revision's instances stay; one instance per changed role of the new revision starts.
  A canary that fails to start → rolling_back.
- baking: every canary instance is ready; `canary_share` of requests go to the canary cohort (changed roles
  served by canary instances only, unchanged roles shared). After bake_s, with at least min_requests canary
  requests, the gate compares the canary cohort with the stable one → promoting or rolling_back. A canary
  whose error rate already exceeds the limit rolls back at once; one that gets too few requests within
  3 × bake_s rolls back (the gate cannot judge it).
- promoting: instance by instance: one more new instance at a time (surge 1), and one old instance drains per
  new one ready; the canary cohort's share follows the new instances' share of the changed roles' ready
  instances. When no old instance of a changed role is left → done.
- rolling_back: canary share 0 at once (canary instances get no new request), the canary instances drain,
  the stable counts stay → rolled_back when none is left.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from trtpd.controller.types import InstanceRow, TrafficSplit
from trtpd.percentiles import quantile
from trtpd.schema.request_sample import RequestSample
from trtpd.schema.slo import Slo

PHASES = ("canary", "baking", "promoting", "rolling_back", "done", "rolled_back")
TERMINAL = ("done", "rolled_back")
SERVER_ERRORS = ("internal", "unavailable")   # a client's own error (invalid_arg) or leaving is not the revision's


@dataclass(frozen=True)
class RolloutPolicy:
    canary_share: float = 0.25
    bake_s: float = 20.0
    min_requests: int = 10
    max_ttft_ratio: float = 1.5      # canary TTFT pP <= this x stable's (P: the SLO's attainment)
    max_tpot_ratio: float = 1.5
    max_error_rate: float = 0.0
    slo: Slo = field(default_factory=Slo)


@dataclass(frozen=True)
class Rollout:
    revision: int                     # the new revision
    stable_revision: int
    changed_roles: tuple[str, ...]
    old_counts: dict[str, int]        # per role, the stable revision's
    new_counts: dict[str, int]        # per role, the new revision's
    phase: str = "canary"
    started_s: float = 0.0
    phase_since_s: float = 0.0
    canary_instances: tuple[str, ...] = ()
    gate: dict | None = None          # what the gate measured and decided
    reason: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Rollout":
        return cls(**{**d, "changed_roles": tuple(d["changed_roles"]),
                      "canary_instances": tuple(d.get("canary_instances", ()))})


@dataclass(frozen=True)
class RolloutStep:
    rollout: Rollout
    want: dict[tuple[str, int], int]
    traffic: TrafficSplit
    events: list[dict] = field(default_factory=list)


def start_rollout(revision: int, stable_revision: int, changed_roles: tuple[str, ...], old_counts: dict[str, int],
                  new_counts: dict[str, int], now_s: float) -> Rollout:
    return Rollout(revision, stable_revision, tuple(changed_roles), dict(old_counts), dict(new_counts),
                   "canary", now_s, now_s)


def gate(canary: list[RequestSample], stable: list[RequestSample], policy: RolloutPolicy) -> dict:
    """Canary cohort vs stable cohort (the gateway's finished requests):
    passed only if the canary's error rate, TTFT pP and TPOT pP (P: the SLO's attainment) meet the SLO and
    are within the allowed ratio of the stable cohort's (when the stable cohort has min_requests too)."""
    q = policy.slo.attainment

    def measure(samples: list[RequestSample]) -> dict:
        judged = [s for s in samples if s.error_kind != "cancelled"]
        errors = [s for s in judged if s.error_kind in SERVER_ERRORS]
        ok = [s for s in judged if s.ok]
        return {"requests": len(judged), "errors": len(errors),
                "error_rate": round(len(errors) / len(judged), 4) if judged else 0.0,
                "ttft_p_s": quantile([s.ttft_s for s in ok], q), "tpot_p_s": quantile([s.tpot_s for s in ok], q)}

    c, s = measure(canary), measure(stable)
    failures = []
    if c["error_rate"] > policy.max_error_rate:
        failures.append(f"canary error rate {c['error_rate']:.3f} > max_error_rate {policy.max_error_rate:g} "
                        f"({c['errors']} of {c['requests']})")
    p = f"p{q * 100:g}"
    for metric, slo, ratio in (("ttft", policy.slo.ttft_s, policy.max_ttft_ratio),
                               ("tpot", policy.slo.tpot_s, policy.max_tpot_ratio)):
        value, base = c[f"{metric}_p_s"], s[f"{metric}_p_s"]
        if value is None:
            continue
        if value > slo:
            failures.append(f"canary {metric.upper()} {p} {value * 1000:.1f} ms > SLO {slo * 1000:.0f} ms")
        if base is not None and s["requests"] >= policy.min_requests and value > ratio * base:
            failures.append(f"canary {metric.upper()} {p} {value * 1000:.1f} ms > {ratio:g} x stable's "
                            f"{base * 1000:.1f} ms")
    return {"canary": c, "stable": s, "passed": not failures, "failures": failures}


def step(rollout: Rollout, table: list[InstanceRow], canary_samples: list[RequestSample],
         stable_samples: list[RequestSample],
         now_s: float, policy: RolloutPolicy) -> RolloutStep:
    """One pass: the next state, what instances to want, how to split traffic."""
    live = [r for r in table if r.state in ("starting", "ready", "draining")]
    new = [r for r in live if r.revision == rollout.revision and r.role in rollout.changed_roles]
    old = [r for r in live if r.revision != rollout.revision and r.role in rollout.changed_roles]
    events: list[dict] = []
    r = rollout

    def to(phase: str, reason: str = "", **changes) -> Rollout:
        events.append({"action": f"rollout_{phase}", "revision": r.revision, "reason": reason,
                       **({"gate": changes["gate"]} if changes.get("gate") else {})})
        return replace(r, phase=phase, phase_since_s=now_s, reason=reason or r.reason, **changes)

    if r.phase == "canary":
        failed = [x for x in table if x.revision == r.revision and x.role in r.changed_roles
                  and x.state in ("failed", "stopped") and x.reason.startswith(("died", "not ready", "health"))]
        ready = [x for x in new if x.state == "ready"]
        if failed:
            r = to("rolling_back", f"canary instance {failed[0].name} failed: {failed[0].reason}")
        elif len(ready) >= len(r.changed_roles) and {x.role for x in ready} >= set(r.changed_roles):
            r = to("baking", "canary ready", canary_instances=tuple(sorted(x.name for x in ready)))
    elif r.phase == "baking":
        result = gate(canary_samples, stable_samples, policy)
        c = result["canary"]
        baked = now_s - r.phase_since_s
        dead = [n for n in r.canary_instances if not any(x.name == n and x.state == "ready" for x in table)]
        if dead:
            r = to("rolling_back", f"canary instance {dead[0]} is no longer ready", gate=result)
        elif c["errors"] >= 3 and c["error_rate"] > policy.max_error_rate:
            r = to("rolling_back", "; ".join(result["failures"]), gate=result)
        elif baked >= policy.bake_s and c["requests"] >= policy.min_requests:
            r = to("promoting", "gate passed", gate=result) if result["passed"] else \
                to("rolling_back", "; ".join(result["failures"]), gate=result)
        elif baked >= 3 * policy.bake_s:
            r = to("rolling_back", f"only {c['requests']} canary requests in {baked:.0f} s "
                                   f"(min_requests {policy.min_requests}): the gate cannot judge", gate=result)
    elif r.phase == "promoting":
        if not old:
            r = to("done", "promoted")
    elif r.phase == "rolling_back":
        if not new:
            r = to("rolled_back", r.reason)

    want: dict[tuple[str, int], int] = {}
    roles = set(r.old_counts) | set(r.new_counts)
    for role in roles:
        if role not in r.changed_roles:   # shared by both revisions; counts follow the new spec once promoted
            count = r.new_counts.get(role, 0) if r.phase in ("promoting", "done") else r.old_counts.get(role, 0)
            # once done, the caller relabels these instances to the new revision (they run the same config)
            want[(role, r.revision if r.phase == "done" else r.stable_revision)] = count
            continue
        ready_new = sum(1 for x in new if x.role == role and x.state == "ready")
        target, stable = r.new_counts.get(role, 0), r.old_counts.get(role, 0)
        if r.phase in ("canary", "baking"):
            want[(role, r.stable_revision)], want[(role, r.revision)] = stable, 1
        elif r.phase == "promoting":
            want[(role, r.revision)] = min(target, ready_new + 1)
            want[(role, r.stable_revision)] = 0 if ready_new >= target else max(0, stable - ready_new)
        elif r.phase == "done":
            want[(role, r.revision)] = target
        else:   # rolling_back, rolled_back
            want[(role, r.stable_revision)], want[(role, r.revision)] = stable, 0
    return RolloutStep(r, want, _traffic(r, new, old, policy.canary_share, want), events)


def _traffic(r: Rollout, new: list[InstanceRow], old: list[InstanceRow], canary_share: float,
             want: dict[tuple[str, int], int]) -> TrafficSplit:
    if r.phase in ("done", "rolled_back"):
        return TrafficSplit(r.revision if r.phase == "done" else r.stable_revision)
    canary = tuple(sorted(x.name for x in new))
    if r.phase == "canary":
        return TrafficSplit(r.stable_revision, r.revision, 0.0, r.changed_roles, canary)
    if r.phase == "baking":
        return TrafficSplit(r.stable_revision, r.revision, canary_share, r.changed_roles, canary)
    if r.phase == "rolling_back":
        return TrafficSplit(r.stable_revision, r.revision, 0.0, r.changed_roles, canary)
    shares = []
    for role in r.changed_roles:   # promoting: the new instances' share of the role's ready ones
        ready_new = sum(1 for x in new if x.role == role and x.state == "ready")
        ready_old = min(want.get((role, r.stable_revision), 0),   # about to drain: no longer counted
                        sum(1 for x in old if x.role == role and x.state == "ready"))
        shares.append(ready_new / (ready_new + ready_old) if ready_new + ready_old else 1.0)
    ready_canary = tuple(sorted(x.name for x in new if x.state == "ready"))
    return TrafficSplit(r.stable_revision, r.revision, round(min(shares, default=1.0), 4), r.changed_roles,
                        ready_canary)
