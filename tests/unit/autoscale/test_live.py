"""The live adapter's observation: decode judged by TPOT, every latency at the SLO's percentile, measured as the
simulator measures it (the same requests give the same TTFT and TPOT live and in simulation)."""

from __future__ import annotations

import pytest

from trtpd.autoscale.live import observe
from trtpd.controller.types import InstanceRow
from trtpd.percentiles import quantile
from trtpd.schema.request_sample import RequestSample
from trtpd.schema.slo import Slo
from trtpd.sim.records import RequestRecords
from trtpd.sim.scaling import window_latencies
from trtpd.sim.workload import RequestArrays

NOW_S, WINDOW_S = 100.0, 30.0
# ten requests that arrived and finished inside the window: (arrival, first token, done, output tokens)
REQUESTS = [(80.0 + i, 80.0 + i + 0.1 * (i + 1), 80.0 + i + 0.1 * (i + 1) + 0.01 * (i + 1) * 9, 10)
            for i in range(10)]
TABLE = [InstanceRow("prefill-0", "prefill", 1, "ready", 0.0), InstanceRow("decode-0", "decode", 1, "ready", 0.0),
         InstanceRow("decode-1", "decode", 1, "draining", 0.0)]


def samples() -> list[RequestSample]:
    """As the gateway keeps them; a single gap (itl_p90_s) far over any SLO."""
    return [RequestSample(t=done, revision=1, ok=True, error_kind=None, ttft_s=first - arrival,
                          tpot_s=(done - first) / (out - 1), num_tokens=out, num_prompt_tokens=100,
                          prefill_queue_s=0.01 * i, decode_queue_s=0.0, itl_p90_s=9.9)
            for i, (arrival, first, done, out) in enumerate(REQUESTS)]


@pytest.mark.parametrize("attainment", [0.5, 0.9, 0.99])
def test_decode_is_judged_by_tpot_at_the_slos_percentile(attainment):
    obs = observe(NOW_S, WINDOW_S, samples(), None, TABLE, Slo(ttft_s=2.0, tpot_s=0.1, attainment=attainment))
    tpots = [s.tpot_s for s in samples()]
    assert obs.roles["decode"].tpot_p_s == pytest.approx(quantile(tpots, attainment))
    assert obs.roles["decode"].tpot_p_s < 0.11          # the 9.9 s single gap is not what decode is judged by
    assert obs.roles["prefill"].ttft_p_s == pytest.approx(quantile([s.ttft_s for s in samples()], attainment))
    assert obs.roles["prefill"].queue_time_p_s == pytest.approx(quantile([0.01 * i for i in range(10)], attainment))
    assert (obs.roles["decode"].num_instances, obs.roles["decode"].num_draining) == (1, 1)
    assert obs.slo.attainment == attainment


def test_live_and_simulated_measure_the_same_requests_alike():
    arrays = RequestArrays([r[0] for r in REQUESTS], [100] * 10, [r[3] for r in REQUESTS])
    records = RequestRecords(arrays)
    for i, (_, first, done, _) in enumerate(REQUESTS):
        records.first_token_s[i], records.done_s[i] = first, done
    slo = Slo(ttft_s=2.0, tpot_s=0.1, attainment=0.9)
    simulated = window_latencies(records, NOW_S, WINDOW_S, q=slo.attainment)
    live = observe(NOW_S, WINDOW_S, samples(), None, TABLE, slo)
    assert live.roles["prefill"].ttft_p_s == pytest.approx(simulated.ttft_p_s, rel=1e-12)
    assert live.roles["decode"].tpot_p_s == pytest.approx(simulated.tpot_p_s, rel=1e-12)
