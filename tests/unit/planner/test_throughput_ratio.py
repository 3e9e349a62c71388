"""Seed 004's worked example (DeepSeek-V3.1 on H200, L_in 6144, L_out 512, TTFT 2 s, TPOT 20 ms)."""

import math

import pytest

from trtpd.errors import ConfigError
from trtpd.planner import throughput_ratio

L_IN, L_OUT = 6144, 512


def test_prefill_throughput_under_ttft():
    # 28300 - 6144 / (2 - 0.1) = 28300 - 3233.7 = 25066.3, "approximately 25000"
    tp = throughput_ratio.prefill_throughput_under_ttft(28300, L_IN, ttft_s=2.0, overhead_s=0.1)
    assert tp == pytest.approx(28300 - 6144 / 1.9)
    assert tp == pytest.approx(25000, rel=0.003)


def test_prefill_throughput_is_the_mm1_bound():
    # at rate = TP_prefill / L_in, the M/M/1 mean sojourn + overhead equals the TTFT target exactly
    tp = throughput_ratio.prefill_throughput_under_ttft(28300, L_IN, 2.0, 0.1)
    assert throughput_ratio.mm1_mean_ttft_s(28300, L_IN, tp / L_IN, 0.1) == pytest.approx(2.0)
    assert throughput_ratio.mm1_mean_ttft_s(28300, L_IN, 28300 / L_IN, 0.1) == math.inf


def test_decode_throughput():
    assert throughput_ratio.decode_throughput(34, 0.020) == pytest.approx(1700)


def test_pd_ratio():
    # (6144 x 1700) / (512 x 25000) = 0.816
    assert throughput_ratio.pd_ratio(L_IN, L_OUT, 25000, 1700) == pytest.approx(0.816)
    assert round(throughput_ratio.pd_ratio(L_IN, L_OUT, 25000, 1700), 2) == 0.82


def test_3p4d_at_4_8m_tokens_per_min():
    plan = throughput_ratio.instance_counts(4.8e6 / 60, L_IN, L_OUT, 25000, 1700)
    assert plan.prefill_instances_exact == pytest.approx(2.954, abs=1e-3)
    assert plan.decode_instances_exact == pytest.approx(3.620, abs=1e-3)
    assert (plan.num_prefill, plan.num_decode) == (3, 4)


def test_5m_tokens_per_min_needs_4_prefill():
    plan = throughput_ratio.instance_counts(5e6 / 60, L_IN, L_OUT, 25000, 1700)
    # (5M / 60) x 6144 / 6656 / 25000 = 3.077 -> the seed writes "3"; it rounds up to 4
    assert round(plan.prefill_instances_exact, 2) == 3.08
    assert plan.decode_instances_exact == pytest.approx(3.771, abs=1e-3)
    assert (plan.num_prefill, plan.num_decode) == (4, 4)
    assert (plan.seed_num_prefill, plan.seed_num_decode) == (3, 4)
    # 3P4D sustains 3 x 25000 x 6656 / 6144 = 81,250 tokens/s = 4.875M tokens/min ("about 4.87M")
    assert plan.seed_max_tokens_per_min == pytest.approx(4.875e6)
    assert plan.seed_binding_role == "prefill"
    assert plan.seed_max_tokens_per_min < 5e6 <= plan.max_tokens_per_min


def test_max_total_tokens_names_the_binding_role():
    tps, role = throughput_ratio.max_total_tokens_per_s(3, 4, L_IN, L_OUT, 25000, 1700)
    assert tps == pytest.approx(81250) and role == "prefill"
    tps, role = throughput_ratio.max_total_tokens_per_s(9, 1, L_IN, L_OUT, 25000, 1700)
    assert tps == pytest.approx(1700 * 6656 / 512) and role == "decode"


def test_unreachable_ttft_is_an_error():
    with pytest.raises(ConfigError, match="unreachable"):
        throughput_ratio.prefill_throughput_under_ttft(28300, L_IN, ttft_s=0.3, overhead_s=0.1)
    with pytest.raises(ConfigError, match="no time"):
        throughput_ratio.prefill_throughput_under_ttft(28300, L_IN, ttft_s=0.1, overhead_s=0.1)
