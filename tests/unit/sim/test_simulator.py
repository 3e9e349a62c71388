import math

import numpy as np
import pytest

from trtpd.sched.prefill import PrefillSchedulerConfig
from trtpd.sim.simulator import Simulator, simulate
from trtpd.sim.workload import RequestArrays, generate_requests, load_workload
from tests.unit.sim.fakes import LinearPerf, colocated, disagg

PERF = LinearPerf(prefill_fixed_s=0.002, prefill_per_token_s=2e-5, decode_fixed_s=0.004, decode_per_seq_s=1e-4,
                  decode_per_context_token_s=2e-8)
SCHED = PrefillSchedulerConfig(max_num_tokens=4096, max_batch_size=8, min_batch_size=2)


@pytest.fixture(scope="module")
def busy_requests():
    return generate_requests(load_workload("chat-powerlaw"), 40.0, 1500, seed=5)


def _records(run):
    r = run.records
    return (r.prefill_start_s, r.prefill_end_s, r.transfer_start_s, r.transfer_end_s, r.first_token_s, r.done_s)


@pytest.mark.parametrize("make", [
    lambda: disagg(PERF, num_prefill=2, num_decode=2, prefill_sched=SCHED, decode_batch=24, kv_tokens=10_000,
                   prefill_kv_tokens=6_000, link_bytes_per_s=2e9),
    lambda: colocated(PERF, num=3, batch=24, max_num_tokens=4096, kv_tokens=10_000),
], ids=["disaggregated", "colocated"])
def test_deferred_growth_matches_the_unmodified_scheduler(make, busy_requests):
    """The fast path decides exactly as ContinuousBatchScheduler called every step (KV limits binding)."""
    fast, exact = simulate(make(), busy_requests), simulate(make(), busy_requests, exact_steps=True)
    assert _records(fast) == _records(exact)
    assert fast.records.num_done == len(busy_requests)
    # the KV limit did bind: some sequences waited for admission although the batch had room
    r = fast.records
    entered = r.transfer_start_s if make().mode == "disaggregated" else r.prefill_start_s
    queued = np.asarray(entered) - np.asarray(r.prefill_end_s if make().mode == "disaggregated" else r.arrival_s)
    assert np.quantile(queued, 0.9) > 0.05


def test_kv_blocks_and_prefill_kv_return_after_the_run(busy_requests):
    sim = Simulator(disagg(PERF, num_prefill=2, num_decode=2, prefill_sched=SCHED, decode_batch=24,
                           kv_tokens=30_000, prefill_kv_tokens=12_000), busy_requests)
    sim.run()
    for d in sim.decodes:
        assert d.scheduler.allocator.num_free_blocks == d.scheduler.allocator.num_blocks
        assert not d.scheduler.running and not d.scheduler.waiting and d.num_ready == 0
        assert d.total_context_tokens == 0
    assert all(p.free_kv_tokens == 12_000 and p.queued_tokens == 0 for p in sim.prefills)


def test_prefill_batches_use_the_shared_scheduler(busy_requests):
    run = simulate(disagg(PERF, prefill_sched=SCHED, num_decode=4), busy_requests)
    starts = np.asarray(run.records.prefill_start_s)
    batch_sizes = np.unique(starts, return_counts=True)[1]
    assert batch_sizes.max() > 1 and batch_sizes.max() <= SCHED.max_batch_size


def test_bucket_timeout_delays_a_lone_request():
    sched = PrefillSchedulerConfig(min_batch_size=2, bucket_timeout_s=0.005)
    run = simulate(disagg(LinearPerf(prefill_fixed_s=0.01), prefill_sched=sched), RequestArrays([0.0], [100], [2]))
    assert run.records.prefill_start_s[0] == pytest.approx(0.005, abs=1e-6)


def test_colocated_prefills_slow_down_decode(busy_requests):
    """As many instances decode either way; the colocated ones also compute the prompts in their steps."""
    dis = simulate(disagg(PERF, num_prefill=1, num_decode=2, prefill_sched=SCHED), busy_requests)
    col = simulate(colocated(PERF, num=2), busy_requests)

    def tpot_p90(run):
        r = run.records
        tpot = (np.asarray(r.done_s) - np.asarray(r.first_token_s)) / (np.asarray(r.output_tokens) - 1)
        return np.quantile(tpot, 0.9)
    assert tpot_p90(col) > 1.2 * tpot_p90(dis)


def test_too_long_prompt_is_rejected_not_crashed():
    arrays = RequestArrays([0.0, 0.1], [100, 10_000], [2, 2])
    run = simulate(disagg(PERF, prefill_sched=SCHED), arrays)
    assert run.num_rejected == 1
    assert not math.isnan(run.records.done_s[0]) and math.isnan(run.records.done_s[1])


def test_usage_reports_busy_share_and_batch():
    arrays = RequestArrays([0.0], [100], [11])
    run = simulate(disagg(LinearPerf(prefill_fixed_s=0.01, decode_fixed_s=0.01)), arrays)
    decode = [u for u in run.usage if u.role == "decode"][0]
    assert decode.mean_batch_size == pytest.approx(1.0)
    assert decode.busy_share == pytest.approx(0.1 / run.span_s)


def test_overloaded_run_stops_early_and_counts_misses():
    from trtpd.sim.metrics import summarize
    from trtpd.sim.simulator import default_max_in_system
    cluster = disagg(LinearPerf(prefill_fixed_s=0.1), prefill_sched=SCHED)     # 10 requests/s at most
    arrays = RequestArrays([i * 0.01 for i in range(5000)], [100] * 5000, [2] * 5000)
    run = simulate(cluster, arrays, max_in_system=200)
    assert run.stopped_overloaded
    s = summarize(run, 1.0, 1.0)
    assert s.num_unfinished > 4000 and s.slo_attainment < 0.1
    assert default_max_in_system(cluster) == 20 * (8 + 64) + 1000


def test_response_latency_shifts_responses_not_scheduling():
    from dataclasses import replace

    from trtpd.sim.metrics import latencies

    requests = RequestArrays([0.0, 0.001, 0.5], [100, 200, 50], [10, 5, 8])
    cluster = disagg(LinearPerf(prefill_per_token_s=1e-4, decode_fixed_s=0.002))
    base = latencies(simulate(cluster, requests), warmup_fraction=0.0)
    shifted = latencies(simulate(replace(cluster, response_latency_s=0.03), requests), warmup_fraction=0.0)
    assert np.allclose(shifted.ttft_s, base.ttft_s + 0.03)
    assert np.allclose(shifted.tpot_s, base.tpot_s)
