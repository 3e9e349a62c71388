"""The simulator against queueing results with closed forms (one prefill server, batch size 1, FIFO)."""

import numpy as np
import pytest

from trtpd.planner import queueing
from trtpd.sim.simulator import simulate
from trtpd.sim.workload import RequestArrays
from tests.unit.sim.fakes import LinearPerf, disagg


def _poisson(rate, n, seed, input_tokens):
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, n)).tolist()
    return RequestArrays(arrivals, list(input_tokens), [2] * n)


def _mean_wait(run, warmup=0.1):
    r = run.records
    start = int(len(r.arrival_s) * warmup)
    return float(np.mean(np.asarray(r.prefill_start_s[start:]) - np.asarray(r.arrival_s[start:])))


@pytest.mark.parametrize("rate", [50.0, 80.0])
def test_md1_mean_wait(rate):
    # deterministic service S = 10 ms; rho = 0.5 -> W = 5 ms; rho = 0.8 -> W = 20 ms
    service_s, n = 0.010, 60_000
    run = simulate(disagg(LinearPerf(prefill_fixed_s=service_s)), _poisson(rate, n, seed=1, input_tokens=[100] * n))
    expected = queueing.md1_mean_wait_s(rate, service_s)
    assert _mean_wait(run) == pytest.approx(expected, rel=0.08)


def test_mm1_mean_wait():
    # exponential prompt lengths (mean 1000 tokens) at 10 us per token: exponential service, mean 10 ms
    rate, n = 50.0, 60_000
    lengths = np.maximum(1, np.rint(np.random.default_rng(7).exponential(1000, n))).astype(int)
    service_s = float(lengths.mean()) * 1e-5
    run = simulate(disagg(LinearPerf(prefill_per_token_s=1e-5)), _poisson(rate, n, seed=2, input_tokens=lengths))
    assert _mean_wait(run) == pytest.approx(queueing.mm1_mean_wait_s(rate, service_s), rel=0.08)


def test_one_request_timeline_is_exact():
    # prefill 20 ms; KV 500 tokens x 1000 B at 1 MB/s + 1 ms = 501 ms; decode 9 steps of 10 ms
    perf = LinearPerf(prefill_fixed_s=0.020, decode_fixed_s=0.010)
    arrays = RequestArrays([1.0], [500], [10])
    run = simulate(disagg(perf, link_bytes_per_s=1e6, link_latency_s=0.001), arrays)
    r = run.records
    assert r.prefill_end_s[0] == pytest.approx(1.020)
    assert r.transfer_end_s[0] - r.transfer_start_s[0] == pytest.approx(0.501)
    # the first token leaves decode with the second, when the first of its 9 steps is done
    assert r.first_token_s[0] == pytest.approx(1.521 + 0.010)
    assert r.done_s[0] == pytest.approx(1.521 + 9 * 0.010)
    run = simulate(disagg(perf, link_bytes_per_s=1e6, first_token_at="prefill"), arrays)
    assert run.records.first_token_s[0] == pytest.approx(1.020)


def test_fp8_kv_halves_the_transfer():
    perf = LinearPerf(prefill_fixed_s=0.001)
    arrays = RequestArrays([0.0], [2048], [2])
    fp16 = simulate(disagg(perf, link_bytes_per_s=1e9, kv_bytes_per_token=327_680), arrays).records
    fp8 = simulate(disagg(perf, link_bytes_per_s=1e9, kv_bytes_per_token=163_840), arrays).records
    t16 = fp16.transfer_end_s[0] - fp16.transfer_start_s[0]
    t8 = fp8.transfer_end_s[0] - fp8.transfer_start_s[0]
    assert t16 == pytest.approx(2048 * 327_680 / 1e9) and t8 == pytest.approx(t16 / 2)


def test_transfers_queue_on_the_link():
    perf = LinearPerf(prefill_fixed_s=0.001)
    arrays = RequestArrays([0.0, 0.0], [1000, 1000], [2, 2])
    cluster = disagg(perf, num_prefill=2, link_bytes_per_s=1e6, kv_bytes_per_token=100)   # 0.1 s each
    r = simulate(cluster, arrays).records
    assert sorted(r.transfer_end_s) == pytest.approx([0.101, 0.201])


def test_decode_batch_cap_queues_the_third_sequence():
    perf = LinearPerf(prefill_fixed_s=0.001, decode_fixed_s=0.010)
    arrays = RequestArrays([0.0, 0.0, 0.0], [10, 10, 10], [5, 5, 5])
    sched = None
    r = simulate(disagg(perf, num_prefill=3, decode_batch=2, prefill_sched=sched), arrays).records
    waits = sorted(np.asarray(r.transfer_start_s) - np.asarray(r.prefill_end_s))
    assert waits[0] == pytest.approx(0) and waits[1] == pytest.approx(0)
    assert waits[2] == pytest.approx(4 * 0.010)     # admitted when the first two finish their 4 steps
