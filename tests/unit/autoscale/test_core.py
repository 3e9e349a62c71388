"""The autoscaler's decision core, rule by rule, on a fake clock (each observation carries its now_s)."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

import trtpd.autoscale.core as autoscale_module
from trtpd.autoscale.core import (AutoscalePolicy, Autoscaler, FleetObservation, RoleObservation, RolePerf)
from trtpd.perf.model import InstancePerf
from trtpd.schema.slo import Slo

SLO_TTFT_S, SLO_TPOT_S = 0.5, 0.05
SLO = Slo(ttft_s=SLO_TTFT_S, tpot_s=SLO_TPOT_S)
MEAN_IN, MEAN_OUT = 512.0, 128.0


class FakePerf:
    """Prefill 10k tokens/s plus 10 ms per batch; a decode step 10 ms plus 0.1 ms per sequence."""

    source = "fake"

    def prefill_s(self, num_tokens, sum_sq_tokens=None):
        return 0.01 + 1e-4 * num_tokens

    def decode_step_s(self, batch_size, total_context_tokens):
        return 0.01 + 1e-4 * batch_size


PERF = {role: RolePerf(InstancePerf(FakePerf(), 1, 10**7, 1000), max_batch_size=64, max_num_tokens=8192)
        for role in ("prefill", "decode")}


def policy(roles=("prefill", "decode"), budget=100, **kw) -> AutoscalePolicy:
    low = {r: kw.pop("min_instances", 1) for r in roles}
    high = {r: kw.pop("max_instances", 20) for r in roles} if "max_instances" in kw else {r: 20 for r in roles}
    cost = kw.pop("cost_per_instance", {r: 1 for r in roles})
    return AutoscalePolicy(low, high, budget, cost, **{"cooldown_s": 60.0, **kw})


def role(name, n, waiting=0, queue=None, ttft=None, tpot=None, draining=0) -> RoleObservation:
    return RoleObservation(name, n, waiting, queue, ttft, tpot, 0.5, draining)


def obs(now_s, rate, roles: dict[str, RoleObservation]) -> FleetObservation:
    return FleetObservation(now_s, rate, MEAN_IN, MEAN_OUT, roles, SLO)


def per_instance(name: str) -> float:
    """What one instance sustains in the SLO (the model's answer, independent of the rate)."""
    return Autoscaler(policy((name,)), PERF).rate_per_instance(name, obs(0.0, 1.0, {}))


def at_utilisation(name: str, n: int, u: float) -> float:
    """The arrival rate at which `n` instances of `name` run at utilisation u (needed / n)."""
    return u * n * per_instance(name)


def test_the_model_is_the_planners_and_finite():
    p, d = per_instance("prefill"), per_instance("decode")
    assert 0 < p < 10000 / MEAN_IN          # below the raw compute rate: queueing within the TTFT SLO
    assert 0 < d and math.isfinite(d)
    a = Autoscaler(policy(("prefill",)), PERF)
    assert a.needed(obs(0, 2 * p, {"prefill": role("prefill", 1)}))["prefill"] == pytest.approx(2.0)


def test_scales_up_on_demand():
    a = Autoscaler(policy(("prefill",)), PERF)
    d = a.decide(obs(100.0, at_utilisation("prefill", 2, 1.2), {"prefill": role("prefill", 2)}))
    assert d.counts == {"prefill": math.ceil(2.4 / 0.85)} and d.changed == {"prefill": (2, 3)} and d.applied
    assert "up to 3" in d.reasons["prefill"]


@pytest.mark.parametrize("name, breach, words", [
    ("prefill", dict(ttft=2 * SLO_TTFT_S), "TTFT P90"),
    ("decode", dict(tpot=2 * SLO_TPOT_S), "TPOT P90"),
    ("decode", dict(queue=SLO_TTFT_S), "queue time P90"),
])
def test_scales_up_on_an_slo_breach_even_if_the_model_says_enough(name, breach, words):
    a = Autoscaler(policy((name,)), PERF)
    rate = at_utilisation(name, 4, 0.6)
    assert not a.decide(obs(100.0, rate, {name: role(name, 4)})).changed     # the model alone: enough
    d = a.decide(obs(200.0, rate, {name: role(name, 4, **breach)}))
    assert d.changed == {name: (4, 5)} and words in d.reasons[name]


def test_a_ttft_breach_explained_by_the_decode_queue_is_decodes():
    a = Autoscaler(policy(), PERF)
    rate = min(at_utilisation("prefill", 4, 0.6), at_utilisation("decode", 4, 0.6))
    d = a.decide(obs(100.0, rate, {"prefill": role("prefill", 4, ttft=2 * SLO_TTFT_S),
                                   "decode": role("decode", 4, queue=SLO_TTFT_S)}))
    assert d.changed.get("decode") == (4, 5) and "prefill" not in d.changed


def test_hysteresis_no_flapping_between_60_and_80_percent():
    a = Autoscaler(policy(("prefill",)), PERF)
    for i in range(20):     # far apart: the cooldown plays no part
        u = 0.6 if i % 2 else 0.8
        d = a.decide(obs(1000.0 * i, at_utilisation("prefill", 4, u), {"prefill": role("prefill", 4)}))
        assert not d.changed, d.reasons
    # the controls: beyond the thresholds it does move
    assert a.decide(obs(1e6, at_utilisation("prefill", 4, 0.9), {"prefill": role("prefill", 4)})).changed
    d = Autoscaler(policy(("prefill",)), PERF).decide(
        obs(1e6, at_utilisation("prefill", 4, 0.3), {"prefill": role("prefill", 4)}))
    assert d.changed == {"prefill": (4, 3)}        # 1.2 instances: 40% of 3 < 50%, 60% of 2 is not


def test_cooldown_refuses_a_second_change_then_allows_it():
    a = Autoscaler(policy(("prefill",), cooldown_s=60.0), PERF)
    high = at_utilisation("prefill", 2, 1.2)
    assert a.decide(obs(0.0, high, {"prefill": role("prefill", 2)})).changed == {"prefill": (2, 3)}
    higher = at_utilisation("prefill", 3, 1.5)
    d = a.decide(obs(59.0, higher, {"prefill": role("prefill", 3)}))
    assert not d.changed and d.counts == {"prefill": 3} and "cooldown" in d.reasons["prefill"]
    d = a.decide(obs(60.0, higher, {"prefill": role("prefill", 3)}))
    assert d.changed == {"prefill": (3, math.ceil(4.5 / 0.85))}


def test_min_and_max_clamp():
    a = Autoscaler(policy(("decode",), min_instances=2, max_instances=5), PERF)
    d = a.decide(obs(0.0, at_utilisation("decode", 4, 10.0), {"decode": role("decode", 4)}))
    assert d.counts == {"decode": 5} and "clamped to 5" in d.reasons["decode"]
    a = Autoscaler(policy(("decode",), min_instances=2, max_instances=5), PERF)
    d = a.decide(obs(0.0, 0.0, {"decode": role("decode", 4)}))
    assert d.counts == {"decode": 2}


def test_over_budget_the_split_follows_the_demand_shares():
    cost = {"prefill": 2, "decode": 1}
    a = Autoscaler(policy(budget=12, cost_per_instance=cost), PERF)
    rate = at_utilisation("prefill", 6, 1.0)     # prefill wants 8 (16 units), decode what this rate needs
    needed = a.needed(obs(0, rate, {"prefill": role("prefill", 1), "decode": role("decode", 1)}))
    d = a.decide(obs(0.0, rate, {"prefill": role("prefill", 1), "decode": role("decode", 1)}))
    units = {r: d.counts[r] * cost[r] for r in cost}
    assert sum(units.values()) <= 12 and min(d.counts.values()) >= 1
    share = needed["prefill"] * 2 / (needed["prefill"] * 2 + needed["decode"])
    assert units["prefill"] / 12 == pytest.approx(share, abs=2 / 12)   # within one prefill instance
    assert all("budget" in d.reasons[r] for r in cost)


def test_an_increase_waits_while_draining_instances_hold_the_budget():
    rate = at_utilisation("decode", 2, 1.2)
    num_prefill = math.ceil(rate / per_instance("prefill") / 0.7)      # in the hysteresis band: kept
    a = Autoscaler(policy(budget=num_prefill + 2 + 2), PERF)           # held: prefill + 2 draining + decode
    roles = {"prefill": role("prefill", num_prefill, draining=2), "decode": role("decode", 2)}
    d = a.decide(obs(0.0, rate, roles))
    assert d.counts["decode"] == 2 and "draining" in d.reasons["decode"]
    roles["prefill"] = role("prefill", 2)                  # the drains are done
    d = a.decide(obs(1.0, rate, roles))
    assert d.counts["decode"] > 2


def test_observe_mode_returns_the_decision_unapplied():
    a = Autoscaler(policy(("prefill",), mode="observe"), PERF)
    high = obs(0.0, at_utilisation("prefill", 2, 1.2), {"prefill": role("prefill", 2)})
    d = a.decide(high)
    assert d.changed == {"prefill": (2, 3)} and not d.applied


def test_observe_mode_decides_what_act_mode_would_observation_for_observation():
    """The same observations (load rising, a cooldown, load falling, a latency that calibrates the model) to an
    autoscaler in each mode: every decision is the same (counts, changes, reasons, the model's needs) but for
    `applied`. An observer that forgot its would-be changes ignored the cooldown after them."""
    rates = [(0.0, 2, 1.2), (10.0, 2, 1.3), (59.0, 3, 1.5), (70.0, 3, 1.5), (140.0, 5, 0.3), (150.0, 5, 0.2),
             (260.0, 3, 0.9), (400.0, 3, 0.6)]
    modes = {m: Autoscaler(policy(("prefill", "decode"), mode=m), PERF) for m in ("act", "observe")}
    decisions = {m: [] for m in modes}
    for now, n, u in rates:
        roles = {"prefill": role("prefill", n, ttft=0.4 if now >= 260 else None),
                 "decode": role("decode", n, tpot=0.02 if now >= 260 else None)}
        for m, a in modes.items():
            decisions[m].append(a.decide(obs(now, at_utilisation("prefill", n, u), roles)))
    assert any(d.changed for d in decisions["act"]) and any("cooldown" in str(d.reasons) for d in decisions["act"])
    for act, observed in zip(decisions["act"], decisions["observe"]):
        assert (observed.counts, observed.changed, observed.reasons, observed.needed) == \
            (act.counts, act.changed, act.reasons, act.needed)
        assert observed.applied is False and act.applied == bool(act.changed)


def test_nothing_changed_is_not_applied():
    a = Autoscaler(policy(("prefill",)), PERF)
    d = a.decide(obs(0.0, at_utilisation("prefill", 4, 0.7), {"prefill": role("prefill", 4)}))
    assert not d.changed and not d.applied and d.counts == {"prefill": 4}


def test_no_scale_down_while_requests_wait():
    low = at_utilisation("decode", 6, 0.1)
    a = Autoscaler(policy(("decode",)), PERF)
    d = a.decide(obs(0.0, low, {"decode": role("decode", 6, waiting=3)}))
    assert not d.changed and "3 requests wait" in d.reasons["decode"]
    d = a.decide(obs(1.0, low, {"decode": role("decode", 6)}))
    assert d.changed == {"decode": (6, 2)}


def test_latency_correction_learns_from_observed_p90():
    a = Autoscaler(policy(("prefill",), cooldown_s=0.0, window_s=10.0), PERF)
    rate = at_utilisation("prefill", 4, 0.7)
    predicted = a.predicted_p_s("prefill", obs(0, rate, {}), rate / 4)
    before = a.needed(obs(0, rate, {}))["prefill"]
    for t in range(5):   # the instances are twice as fast as the model says
        a.decide(obs(100.0 + t, rate, {"prefill": role("prefill", 4, ttft=predicted / 2)}))
    assert a.correction["prefill"] == pytest.approx(0.5, rel=0.05)
    assert a.needed(obs(0, rate, {}))["prefill"] < before


def test_policy_errors_name_the_field():
    with pytest.raises(ValueError, match="scale_down_utilisation"):
        policy(scale_up_utilisation=0.5, scale_down_utilisation=0.6)
    with pytest.raises(ValueError, match="budget 1 is below"):
        policy(budget=1)
    with pytest.raises(ValueError, match="mode"):
        policy(mode="auto")
    with pytest.raises(ValueError, match="same roles"):
        AutoscalePolicy({"prefill": 1}, {"decode": 2}, 4, {"prefill": 1})
    with pytest.raises(ValueError, match="no performance model"):
        Autoscaler(policy(), {"prefill": PERF["prefill"]})


def test_the_core_is_pure():
    """No I/O, clock or threads: the module imports only these."""
    tree = ast.parse(Path(autoscale_module.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert imported <= {"__future__", "math", "dataclasses", "typing", "trtpd.perf.model", "trtpd.planner.estimate",
                        "trtpd.planner.role_models", "trtpd.schema.slo"}
