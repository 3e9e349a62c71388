"""`trtpd history`'s line for an audit entry that carries the rollout gate's measurement."""

from __future__ import annotations

from trtpd.cli.controller_client import format_event
from trtpd.controller.rollout import RolloutPolicy, gate
from trtpd.controller.store import AuditRow
from trtpd.schema.request_sample import RequestSample
from trtpd.schema.slo import Slo


def sample(revision, tpot):
    return RequestSample(t=0.0, revision=revision, ok=True, error_kind=None, ttft_s=0.1, tpot_s=tpot, num_tokens=5)


def test_a_gate_entry_shows_both_cohorts_ttft_and_tpot():
    measured = gate([sample(2, 0.15)] * 5, [sample(1, 0.02)] * 5, RolloutPolicy(slo=Slo(tpot_s=0.1)))
    line = format_event(AuditRow(1, 0.0, "controller", "rollout_rolling_back", 2, {"gate": measured}))
    assert "canary 5 req, TTFT p 100.0 ms, TPOT p 150.0 ms, errors 0 | stable 5 req" in line
    assert "TPOT p 20.0 ms" in line


def test_a_gate_recorded_before_tpot_still_prints():
    old = {"canary": {"requests": 5, "ttft_p_s": 0.1, "itl_p_s": 0.2, "errors": 0},
           "stable": {"requests": 5, "ttft_p_s": 0.1, "itl_p_s": 0.02, "errors": 0}}
    assert "TPOT p -" in format_event(AuditRow(1, 0.0, "controller", "rollout_rolling_back", 2, {"gate": old}))
