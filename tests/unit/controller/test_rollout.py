"""The rollout core and the canary split over a fake clock: every phase, the gate, the traffic it sets."""

from __future__ import annotations

import pytest

from trtpd.controller.rollout import RolloutPolicy, gate, start_rollout, step
from trtpd.controller.types import InstanceRow
from trtpd.routing.cohorts import Split
from trtpd.schema.request_sample import RequestSample
from trtpd.schema.slo import Slo

POLICY = RolloutPolicy(canary_share=0.25, bake_s=10, min_requests=4, max_ttft_ratio=1.5, max_tpot_ratio=1.5,
                       max_error_rate=0.0, slo=Slo(ttft_s=1.0, tpot_s=0.1, attainment=0.9))


def row(name, state, revision, reason=""):
    return InstanceRow(name, name.rsplit("-", 1)[0], revision, state, 0.0, reason, {})


def sample(revision, ttft=0.1, tpot=0.02, error=None):
    return RequestSample(t=0.0, revision=revision, ok=error is None, error_kind=error, ttft_s=ttft, tpot_s=tpot,
                         num_tokens=10)


def decode_rollout(now=0.0, new_decode=1):
    return start_rollout(2, 1, ("decode",), {"prefill": 1, "decode": 1}, {"prefill": 1, "decode": new_decode}, now)


STABLE = [row("prefill-0", "ready", 1), row("decode-0", "ready", 1)]


def test_canary_phase_wants_one_canary_per_changed_role_and_no_traffic():
    out = step(decode_rollout(), STABLE, [], [], 1.0, POLICY)
    assert out.rollout.phase == "canary"
    assert out.want == {("prefill", 1): 1, ("decode", 1): 1, ("decode", 2): 1}
    assert out.traffic.canary_share == 0.0 and out.traffic.canary_revision == 2


def test_canary_ready_starts_baking_with_the_configured_share():
    table = STABLE + [row("decode-1", "ready", 2)]
    out = step(decode_rollout(), table, [], [], 2.0, POLICY)
    assert out.rollout.phase == "baking" and out.rollout.canary_instances == ("decode-1",)
    assert out.traffic.canary_share == 0.25 and out.traffic.canary_instances == ("decode-1",)
    assert out.traffic.changed_roles == ("decode",)


def test_a_canary_that_fails_to_start_rolls_back():
    table = STABLE + [row("decode-1", "stopped", 2, reason="died: tritonserver exited")]
    out = step(decode_rollout(), table, [], [], 2.0, POLICY)
    assert out.rollout.phase == "rolling_back" and "decode-1" in out.rollout.reason
    assert out.want[("decode", 2)] == 0 and out.traffic.canary_share == 0.0


def baking(table, now=2.0):
    return step(decode_rollout(), table, [], [], now, POLICY).rollout


def test_gate_waits_for_bake_time_and_min_requests_then_promotes():
    table = STABLE + [row("decode-1", "ready", 2)]
    r = baking(table)
    good_canary, good_stable = [sample(2)] * 5, [sample(1)] * 15
    assert step(r, table, good_canary, good_stable, 11.0, POLICY).rollout.phase == "baking"   # 9 s baked
    assert step(r, table, good_canary[:3], good_stable, 13.0, POLICY).rollout.phase == "baking"   # 3 requests
    out = step(r, table, good_canary, good_stable, 13.0, POLICY)
    assert out.rollout.phase == "promoting" and out.rollout.gate["passed"]
    assert out.events[0]["action"] == "rollout_promoting" and out.events[0]["gate"]["canary"]["requests"] == 5


@pytest.mark.parametrize("canary, reason", [
    ([sample(2, tpot=0.15)] * 5, "TPOT p90 150.0 ms > SLO 100 ms"),
    ([sample(2, ttft=0.5)] * 5, "TTFT p90 500.0 ms > 1.5 x stable's 100.0 ms"),
    ([sample(2)] * 4 + [sample(2, error="internal")], "error rate 0.200"),
])
def test_gate_failures_roll_back(canary, reason):
    table = STABLE + [row("decode-1", "ready", 2)]
    out = step(baking(table), table, canary, [sample(1)] * 10, 13.0, POLICY)
    assert out.rollout.phase == "rolling_back" and reason in out.rollout.reason
    assert out.traffic.canary_share == 0.0 and out.want[("decode", 2)] == 0 and out.want[("decode", 1)] == 1


def test_errors_roll_back_before_the_bake_ends():
    table = STABLE + [row("decode-1", "ready", 2)]
    errors = [sample(2, error="unavailable")] * 3
    assert step(baking(table), table, errors, [], 3.0, POLICY).rollout.phase == "rolling_back"


def test_client_errors_and_cancellations_are_not_the_revisions_fault():
    canary = [sample(2)] * 4 + [sample(2, error="invalid_arg"), sample(2, error="cancelled")]
    result = gate(canary, [sample(1)] * 4, POLICY)
    assert result["passed"] and result["canary"]["requests"] == 5 and result["canary"]["errors"] == 0


def test_too_few_requests_rolls_back_after_three_bakes():
    table = STABLE + [row("decode-1", "ready", 2)]
    r = baking(table)
    assert step(r, table, [sample(2)], [], 31.0, POLICY).rollout.phase == "baking"
    out = step(r, table, [sample(2)], [], 32.5, POLICY)
    assert out.rollout.phase == "rolling_back" and "cannot judge" in out.rollout.reason


def test_a_canary_lost_while_baking_rolls_back():
    table = STABLE + [row("decode-1", "ready", 2)]
    r = baking(table)
    out = step(r, STABLE + [row("decode-1", "stopped", 2, "died: x")], [], [], 4.0, POLICY)
    assert out.rollout.phase == "rolling_back"


def test_promotion_goes_instance_by_instance():
    r = start_rollout(2, 1, ("decode",), {"prefill": 1, "decode": 2}, {"prefill": 1, "decode": 2}, 0.0)
    table = [row("prefill-0", "ready", 1), row("decode-0", "ready", 1), row("decode-1", "ready", 1),
             row("decode-2", "ready", 2)]
    r = step(r, table, [], [], 1.0, POLICY).rollout
    from dataclasses import replace
    r = replace(r, phase="promoting")
    out = step(r, table, [], [], 20.0, POLICY)
    # one new one ready: want a second new one, keep one old one fewer
    assert out.want[("decode", 2)] == 2 and out.want[("decode", 1)] == 1
    assert out.traffic.canary_share == 0.5
    table2 = table[:2] + [row("decode-1", "draining", 1), row("decode-2", "ready", 2), row("decode-3", "ready", 2)]
    out2 = step(r, table2, [], [], 25.0, POLICY)
    assert out2.want[("decode", 2)] == 2 and out2.want[("decode", 1)] == 0
    assert out2.traffic.canary_share == 1.0 and out2.rollout.phase == "promoting"   # decode-0/1 still there
    table3 = [row("prefill-0", "ready", 1), row("decode-2", "ready", 2), row("decode-3", "ready", 2)]
    out3 = step(r, table3, [], [], 30.0, POLICY)
    assert out3.rollout.phase == "done" and not Split(**vars(out3.traffic)).active
    assert out3.want == {("prefill", 2): 1, ("decode", 2): 2}   # the kept prefill is relabelled by the caller


def test_rolled_back_when_no_canary_instance_is_left():
    from dataclasses import replace
    r = replace(decode_rollout(), phase="rolling_back", reason="gate failed")
    assert step(r, STABLE + [row("decode-1", "draining", 2)], [], [], 5.0, POLICY).rollout.phase == "rolling_back"
    out = step(r, STABLE, [], [], 6.0, POLICY)
    assert out.rollout.phase == "rolled_back" and out.traffic.canary_revision == 0


def test_both_roles_changed_keep_kv_within_a_revision():
    split = Split(1, 2, 0.5, ("prefill", "decode"), ("prefill-1", "decode-1"))
    instances = [("prefill-0", "prefill"), ("decode-0", "decode"), ("prefill-1", "prefill"), ("decode-1", "decode")]
    assert split.excluded(1, instances) == {"prefill-1", "decode-1"}
    assert split.excluded(2, instances) == {"prefill-0", "decode-0"}


def test_unchanged_roles_are_shared_by_both_cohorts():
    split = Split(1, 2, 0.5, ("decode",), ("decode-1",))
    instances = [("prefill-0", "prefill"), ("decode-0", "decode"), ("decode-1", "decode")]
    assert split.excluded(2, instances) == {"decode-0"}
    assert split.excluded(1, instances) == {"decode-1"}


@pytest.mark.parametrize("share", [0.1, 0.25, 0.5, 1 / 3])
def test_canary_share_is_exact_over_any_window(share):
    split = Split(1, 2, share, ("decode",), ("decode-1",))
    picks = [split.revision_for(n) == 2 for n in range(1000)]
    for start in (0, 137, 500):
        window = picks[start:start + 100]
        assert abs(sum(window) - 100 * share) <= 1
    assert Split(1, 0, 0.5).revision_for(3) == 1   # no canary: all stable
