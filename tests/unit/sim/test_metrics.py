import math

import numpy as np
import pytest

from trtpd.sim.goodput import max_goodput_rate_per_s
from trtpd.sim.metrics import summarize
from trtpd.sim.records import RequestRecords
from trtpd.sim.simulator import SimRun
from trtpd.sim.workload import RequestArrays


def _run(first_token, done, outputs):
    n = len(first_token)
    records = RequestRecords(RequestArrays([float(i) for i in range(n)], [10] * n, outputs))
    records.first_token_s = [i + t for i, t in enumerate(first_token)]
    records.done_s = [i + d if d is not None else math.nan for i, d in enumerate(done)]
    return SimRun(records, [], [], float(n), 0)


def test_ttft_tpot_attainment_and_goodput():
    # TTFT 0.1..1.0 s; TPOT = (done - first) / (outputs - 1)
    ttft = [0.1 * (i + 1) for i in range(10)]
    outputs = [11] * 9 + [1]
    done = [t + 10 * 0.02 for t in ttft[:5]] + [t + 10 * 0.2 for t in ttft[5:9]] + [ttft[9]]
    s = summarize(_run(ttft, done, outputs), ttft_slo_s=0.75, tpot_slo_s=0.05, warmup_fraction=0.0)
    assert s.ttft_s.p50 == pytest.approx(np.percentile(ttft, 50))
    assert s.tpot_s.p50 == pytest.approx(0.02)              # 9 requests with a TPOT, 5 at 20 ms
    # meets both: TTFT <= 0.75 and TPOT <= 50 ms -> requests 0..4 (the one-token request misses on TTFT)
    assert s.slo_attainment == pytest.approx(0.5)
    assert s.goodput_per_s == pytest.approx(0.5 * 10 / 9)    # 10 arrivals over 9 s
    assert s.num_unfinished == 0


def test_unfinished_requests_miss():
    s = summarize(_run([0.1, 0.1], [0.2, None], [2, 2]), 1.0, 1.0, warmup_fraction=0.0)
    assert s.num_unfinished == 1 and s.slo_attainment == pytest.approx(0.5)


def test_goodput_search_brackets_the_threshold():
    def probe(cluster, workload, rate, ttft_s, tpot_s, n, seed):
        return 1.0 if rate <= 13.7 else 0.5
    g = max_goodput_rate_per_s(None, None, 1, 1, 0.9, start_rate_per_s=1.0, num_bisections=12, probe=probe)
    assert g.rate_per_s == pytest.approx(13.7, rel=0.01) and g.rate_per_s <= 13.7


@pytest.mark.parametrize("threshold", [0.05, 3.0, 8.0, 9.4, 10.0, 11.0, 12.4, 40.0])
def test_goodput_search_near_a_good_start_brackets_to_the_resolution(threshold):
    """The planner's search (a start near the answer, steps of 1.25x up or down, bisection to 1/32 of the
    low end): within that resolution below the threshold, from either side of the start, in fewer probes
    than doubling from half the start where the start is close."""
    def probe(cluster, workload, rate, ttft_s, tpot_s, n, seed):
        return 1.0 if rate <= threshold else 0.5
    g = max_goodput_rate_per_s(None, None, 1, 1, 0.9, start_rate_per_s=9.0, num_bisections=5, probe=probe,
                               growth=1.25, resolution=1 / 32)
    assert g.rate_per_s <= threshold and threshold - g.rate_per_s <= threshold / 32, [r for r, _ in g.probes]
    assert len(g.probes) <= 16             # 180x below the start: 1 + 3 steps of 1.25x, 7 halvings, 5 bisections
    doubling = max_goodput_rate_per_s(None, None, 1, 1, 0.9, start_rate_per_s=4.5, num_bisections=5, probe=probe)
    if 8.0 <= threshold <= 11.0:           # within 0.9-1.2x of the start
        assert len(g.probes) < len(doubling.probes)
