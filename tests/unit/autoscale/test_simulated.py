"""The simulator with the controller's autoscaler on a small day/night workload (fake, fast perf models).

Day: long prompts, short answers (prefill-heavy); night: short prompts, long answers (decode-heavy). With a
budget of 6 instances, day needs 4+ prefill and night 4+ decode instances: no fixed split serves both.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from trtpd.cli.main import main
from trtpd.autoscale.simulated import SimAutoscaler, compare_autoscaled, load_policy, role_perf
from trtpd.autoscale.core import AutoscalePolicy, Autoscaler
from trtpd.errors import ConfigError
from trtpd.sched.prefill import PrefillSchedulerConfig
from trtpd.schema.slo import Slo
from trtpd.sim.scaling import ScalingOptions
from trtpd.sim.simulator import simulate
from trtpd.autoscale.fixed_splits import splits_within, with_counts
from trtpd.sim.workload import WorkloadSpec, generate_requests
from tests.unit.sim.fakes import LinearPerf, disagg

PERF = LinearPerf(prefill_fixed_s=0.002, prefill_per_token_s=1e-4, decode_fixed_s=0.01, decode_per_seq_s=5e-4)
CLUSTER = disagg(PERF, 3, 3, prefill_sched=PrefillSchedulerConfig(max_num_tokens=4096, max_batch_size=8,
                                                                  min_batch_size=1), decode_batch=64)
PHASE_S = 120.0
WORKLOAD = WorkloadSpec.model_validate({"name": "small-daynight", "phases": [
    {"name": "day", "duration_s": PHASE_S, "rate_per_s": 32,
     "input_tokens": {"kind": "uniform", "min_tokens": 800, "max_tokens": 1200},
     "output_tokens": {"kind": "uniform", "min_tokens": 8, "max_tokens": 24}},
    {"name": "night", "duration_s": PHASE_S, "rate_per_s": 28,
     "input_tokens": {"kind": "uniform", "min_tokens": 50, "max_tokens": 150},
     "output_tokens": {"kind": "uniform", "min_tokens": 150, "max_tokens": 250}}]})
SLO = Slo(ttft_s=0.5, tpot_s=0.05)
POLICY = AutoscalePolicy({"prefill": 1, "decode": 1}, {"prefill": 5, "decode": 5}, 6, {"prefill": 1, "decode": 1},
                         cooldown_s=6.0, interval_s=2.0, window_s=6.0, scale_up_utilisation=0.9)
STARTUP_S = 5.0


@pytest.fixture(scope="module")
def requests():
    return generate_requests(WORKLOAD, None, None, seed=0)


@pytest.fixture(scope="module")
def comparison(requests):
    return compare_autoscaled(CLUSTER, requests, POLICY, SLO, STARTUP_S)


def held_at(run, role: str, t: float) -> int:
    """Instances of `role` started (or starting) and not yet draining at time t."""
    return sum(1 for life in run.instances if life.role == role and life.created_s <= t
               and not (min(life.drain_s, life.removed_s) <= t))


def test_the_counts_follow_the_phase_change(comparison):
    run = comparison.run
    late_day, late_night = 0.9 * PHASE_S, 1.9 * PHASE_S
    assert held_at(run, "prefill", late_day) > held_at(run, "prefill", late_night)
    assert held_at(run, "decode", late_day) < held_at(run, "decode", late_night)
    assert {e.role for e in run.scale_events} == {"prefill", "decode"}
    assert all(d.counts["prefill"] + d.counts["decode"] <= POLICY.budget for d in comparison.decisions)


def test_drain_aware_removal_loses_no_request(comparison, requests):
    run = comparison.run
    assert run.records.num_done == len(requests) and comparison.autoscaled.summary.num_unfinished == 0
    removed = [life for life in run.instances if not math.isnan(life.removed_s) and not math.isnan(life.ready_s)]
    assert removed, "the autoscaler drained no ready instance: nothing was checked"
    assert any(life.removed_s > life.drain_s for life in removed)     # some drained with work left
    r = run.records
    for life in removed:   # it left only after the last request it served was done with it
        if life.role == "prefill":
            served = [i for i in range(len(requests)) if r.prefill_instance[i] == life.index
                      and r.arrival_s[i] >= life.ready_s]
            last_s = max((r.transfer_end_s[i] for i in served), default=life.drain_s)
        else:
            served = [i for i in range(len(requests)) if r.decode_instance[i] == life.index]
            last_s = max((r.done_s[i] for i in served), default=life.drain_s)
        assert life.removed_s >= last_s


def test_a_draining_instance_takes_no_new_request(comparison, requests):
    run = comparison.run
    r = run.records
    drained = [life for life in run.instances if not math.isnan(life.drain_s) and not math.isnan(life.ready_s)]
    assert drained
    for life in drained:
        if life.role == "prefill":   # routed on arrival
            routed_s = [r.arrival_s[i] for i in range(len(requests)) if r.prefill_instance[i] == life.index
                        and r.arrival_s[i] >= life.created_s]
        else:                        # routed when its prefill finished
            routed_s = [r.prefill_end_s[i] for i in range(len(requests)) if r.decode_instance[i] == life.index]
        assert all(t < life.drain_s for t in routed_s), life
        assert all(t >= life.ready_s for t in routed_s if life.created_s > 0), life    # nor while starting


def _autoscaled_run(requests, policy=POLICY, start=(4, 2)):
    scaler = SimAutoscaler(Autoscaler(policy, role_perf(CLUSTER)), SLO)
    run = simulate(with_counts(CLUSTER, *start), requests, scaler=scaler,
                   scaling=ScalingOptions(policy.interval_s, policy.window_s, STARTUP_S))
    return run, scaler.decisions


def test_two_runs_are_identical(requests):
    (a, da), (b, db) = _autoscaled_run(requests), _autoscaled_run(requests)
    assert a.records.done_s == b.records.done_s and a.records.first_token_s == b.records.first_token_s
    assert a.scale_events == b.scale_events and da == db
    assert generate_requests(WORKLOAD, None, None, seed=0) == requests


def test_autoscaling_beats_the_best_fixed_split_in_the_same_budget(comparison):
    best, auto = comparison.best_fixed, comparison.autoscaled
    assert (best.num_prefill, best.num_decode) in splits_within(6, POLICY.cost_per_instance, POLICY.min_instances,
                                                                POLICY.max_instances)
    # measured: autoscaled 88%, best fixed (4P2D) 55%; no fixed split reaches 60%
    assert max(r.attainment for r in comparison.fixed) < 0.6
    assert auto.attainment > best.attainment + 0.2, (auto.attainment, best.attainment)
    assert auto.instance_s < best.instance_s


def test_an_autoscaler_that_never_acts_scores_the_best_fixed_split(comparison, requests):
    """The margin above is the autoscaler's: starting from the best split and doing nothing scores it."""
    observe = AutoscalePolicy(POLICY.min_instances, POLICY.max_instances, POLICY.budget, POLICY.cost_per_instance,
                              cooldown_s=6.0, interval_s=2.0, window_s=6.0, scale_up_utilisation=0.9, mode="observe")
    best = comparison.best_fixed
    run, decisions = _autoscaled_run(requests, observe, (best.num_prefill, best.num_decode))
    assert not run.scale_events and any(d.changed for d in decisions) and not any(d.applied for d in decisions)
    assert run.records.done_s == simulate(with_counts(CLUSTER, best.num_prefill, best.num_decode), requests,
                                          max_in_system=10**9).records.done_s


# -- the phased workload -------------------------------------------------------------------------------
def test_phases_generate_their_own_rates_and_lengths(requests):
    a = np.asarray(requests.arrival_s)
    day, night = a < PHASE_S, a >= PHASE_S
    assert day.sum() / PHASE_S == pytest.approx(32, rel=0.1) and night.sum() / PHASE_S == pytest.approx(28, rel=0.1)
    inputs, outputs = np.asarray(requests.input_tokens), np.asarray(requests.output_tokens)
    assert inputs[day].min() >= 800 and inputs[night].max() <= 150 and outputs[night].min() >= 150
    assert a.max() < 2 * PHASE_S and np.all(np.diff(a) >= 0)
    assert WORKLOAD.phase_at(PHASE_S + 1).name == "night" and WORKLOAD.phase_at(3 * PHASE_S) is None


def test_a_rate_rescales_the_phases_and_num_requests_caps_them():
    doubled = generate_requests(WORKLOAD, 2 * WORKLOAD.mean_rate_per_s, None, seed=0)
    plain = generate_requests(WORKLOAD, None, None, seed=0)
    assert len(doubled) == pytest.approx(2 * len(plain), rel=0.05)
    assert len(generate_requests(WORKLOAD, None, 100, seed=0)) == 100
    assert WORKLOAD.input_stats().mean == pytest.approx((32 * 1000 + 28 * 100) / 60, rel=0.02)


def test_phase_errors():
    with pytest.raises(ValueError, match="per phase"):
        WorkloadSpec.model_validate({"phases": WORKLOAD.model_dump()["phases"],
                                     "input_tokens": {"kind": "fixed", "tokens": 5}})
    with pytest.raises(ValueError, match="at least one phase"):
        WorkloadSpec.model_validate({"phases": []})


# -- the policy and the command ------------------------------------------------------------------------
def test_policy_from_inline_pairs_and_yaml(tmp_path):
    p = load_policy("budget=8,cooldown_s=20,min_decode=2,mode=observe", {"prefill": 1, "decode": 2})
    assert (p.budget, p.cooldown_s, p.min_instances, p.mode) == (8, 20.0, {"prefill": 1, "decode": 2}, "observe")
    assert p.cost_per_instance == {"prefill": 1, "decode": 2} and p.max_instances == {"prefill": 4, "decode": 3}
    path = tmp_path / "policy.yaml"
    path.write_text("budget: 6\nmax_instances: {prefill: 4, decode: 5}\nscale_up_utilisation: 0.9\n")
    p = load_policy(str(path), {"prefill": 1, "decode": 1})
    assert p.max_instances == {"prefill": 4, "decode": 5} and p.scale_up_utilisation == 0.9
    with pytest.raises(ConfigError, match="unknown policy key budgett"):
        load_policy("budgett=3", {"prefill": 1, "decode": 1})
    with pytest.raises(ConfigError, match="scale_down_utilisation"):
        load_policy("scale_down_utilisation=0.95", {"prefill": 1, "decode": 1})


def test_simulate_autoscale_prints_the_timeline_and_the_comparison(tmp_path, capsys):
    wl = tmp_path / "dn.yaml"
    wl.write_text("name: dn\nphases:\n"
                  "  - {name: day, duration_s: 40, rate_per_s: 6, input_tokens: {kind: fixed, tokens: 1200},"
                  " output_tokens: {kind: fixed, tokens: 16}}\n"
                  "  - {name: night, duration_s: 40, rate_per_s: 10, input_tokens: {kind: fixed, tokens: 100},"
                  " output_tokens: {kind: fixed, tokens: 200}}\n")
    code = main(["simulate", "--model", "tiny-llama", "--hardware", "cpu-reference", "--weight-dtype", "fp32",
                 "--kv-dtype", "fp16", "--prefill-max-num-tokens", "2048", "--decode-max-batch-size", "32",
                 "--workload", str(wl), "--slo", "reference-cpu", "--startup-s", "5",
                 "--autoscale", "budget=4,cooldown_s=10,interval_s=5,window_s=10",
                 "--json", str(tmp_path / "out.json")])
    out = capsys.readouterr().out
    assert code == 0
    assert "timeline:" in out and "best fixed" in out and "autoscaled (from" in out
    assert "instance-s" in out and (tmp_path / "out.json").is_file()
