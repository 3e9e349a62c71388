"""The colocated step policies against hand-computed timelines, and their fast path against the scheduler."""

from dataclasses import replace

import numpy as np
import pytest

from trtpd.sim.simulator import Simulator, simulate
from trtpd.sim.workload import RequestArrays, generate_requests, load_workload
from tests.unit.sim.fakes import LinearPerf, colocated

# prefill 0.1 ms per token, decode step 10 ms; LinearPerf has no mixed_step_s, so a mixed step costs both
PERF = LinearPerf(prefill_per_token_s=1e-4, decode_fixed_s=0.010)


def _cluster(policy, max_num_tokens=8192, batch=64, kv_tokens=10_000_000, num=1):
    return replace(colocated(PERF, num=num, batch=batch, max_num_tokens=max_num_tokens, kv_tokens=kv_tokens),
                   colocated_policy=policy)


def test_chunked_prompt_spans_steps_within_the_budget():
    # 200 tokens, budget 64: chunks 64 + 64 + 64 + 8 = 20 ms of prefill, first token with the last chunk
    run = simulate(_cluster("chunked", max_num_tokens=64), RequestArrays([0.0], [200], [3]))
    r = run.records
    assert r.first_token_s[0] == pytest.approx(0.0200)
    assert r.done_s[0] == pytest.approx(0.0200 + 2 * 0.010)
    assert run.num_rejected == 0     # longer than the budget, but chunked prompts span steps


def test_chunked_budget_counts_decode_rows_first():
    # A (10 tokens) prefills in [0, 1 ms]; B (200 tokens) arrives meanwhile; then every step has A's decode
    # row (10 ms) and a 63-token chunk (6.3 ms): 63 + 63 + 63 + 11
    run = simulate(_cluster("chunked", max_num_tokens=64), RequestArrays([0.0, 0.0005], [10, 200], [100, 2]))
    r = run.records
    assert r.first_token_s[0] == pytest.approx(0.001)
    assert r.prefill_start_s[1] == pytest.approx(0.001)
    assert r.first_token_s[1] == pytest.approx(0.001 + 3 * 0.0163 + 0.0111)


def test_inflight_refuses_prompts_over_the_budget_and_chunked_does_not():
    arrays = RequestArrays([0.0], [100], [2])
    assert simulate(_cluster("inflight", max_num_tokens=64), arrays).num_rejected == 1
    assert simulate(_cluster("chunked", max_num_tokens=64), arrays).num_rejected == 0


def test_prefill_first_pauses_decode_for_a_waiting_prompt():
    # A: 200-token prompt (20 ms), 11 tokens out; B arrives at 45 ms, during A's third decode step (40-50 ms)
    # B's prefill-only step [50, 70 ms] pauses A: A's 10 decode steps take 100 ms + 20 ms
    run = simulate(_cluster("prefill_first"), RequestArrays([0.0, 0.045], [200, 200], [11, 2]))
    r = run.records
    assert r.first_token_s[0] == pytest.approx(0.020)
    assert r.prefill_start_s[1] == pytest.approx(0.050)
    assert r.first_token_s[1] == pytest.approx(0.070)
    assert r.done_s[0] == pytest.approx(0.020 + 10 * 0.010 + 0.020)
    # inflight: B joins A's step at 50 ms (20 + 10 ms), its first token at 80 ms
    r = simulate(_cluster("inflight"), RequestArrays([0.0, 0.045], [200, 200], [11, 2])).records
    assert r.first_token_s[1] == pytest.approx(0.080)


def test_prefill_first_batches_waiting_prompts_up_to_the_budget():
    # three prompts wait behind the first one's prefill; two fit in 512 tokens, the third goes next
    arrays = RequestArrays([0.0, 0.001, 0.002, 0.003], [100, 250, 250, 250], [2, 2, 2, 2])
    r = simulate(_cluster("prefill_first", max_num_tokens=512), arrays).records
    assert r.prefill_start_s[1] == r.prefill_start_s[2] == pytest.approx(0.010)
    assert r.first_token_s[1] == pytest.approx(0.010 + 0.050)
    assert r.prefill_start_s[3] == pytest.approx(0.060)


@pytest.fixture(scope="module")
def busy_requests():
    return generate_requests(load_workload("chat-powerlaw"), 40.0, 1200, seed=5)


@pytest.mark.parametrize("policy", ["chunked", "prefill_first"])
def test_fast_path_matches_the_scheduler_called_every_step(policy, busy_requests):
    perf = LinearPerf(prefill_fixed_s=0.002, prefill_per_token_s=2e-5, decode_fixed_s=0.004, decode_per_seq_s=1e-4,
                      decode_per_context_token_s=2e-8)
    make = lambda: replace(colocated(perf, num=3, batch=24, max_num_tokens=2048, kv_tokens=10_000),  # noqa: E731
                           colocated_policy=policy)
    fast, exact = simulate(make(), busy_requests), simulate(make(), busy_requests, exact_steps=True)
    r_f, r_e = fast.records, exact.records
    assert (r_f.prefill_start_s, r_f.first_token_s, r_f.done_s) == (r_e.prefill_start_s, r_e.first_token_s, r_e.done_s)
    assert r_f.num_done == len(busy_requests) - fast.num_rejected
    sim = Simulator(make(), busy_requests)
    sim.run()
    for c in sim.colocated:     # every block back, nothing left running
        assert c.scheduler.allocator.num_free_blocks == c.scheduler.allocator.num_blocks
        assert not c.scheduler.running and c.num_ready == 0 and c.total_context_tokens == 0


def test_chunked_bounds_every_step_where_inflight_takes_long_prompts_whole(busy_requests):
    """Long prompts inflate inflight steps; chunking bounds every step by the budget (the prompt tokens a step
    computes, read from the step times the instance asks for)."""
    class Recording(LinearPerf):
        def __init__(self):
            super().__init__(prefill_fixed_s=0.002, prefill_per_token_s=2e-5, decode_fixed_s=0.004,
                             decode_per_seq_s=1e-4)
            self.most_prompt_tokens = 0

        def prefill_s(self, num_tokens, sum_sq_tokens=None):
            self.most_prompt_tokens = max(self.most_prompt_tokens, num_tokens)
            return super().prefill_s(num_tokens, sum_sq_tokens)

    def most_prompt_tokens(policy, budget):
        perf = Recording()
        run = simulate(replace(colocated(perf, num=3, batch=64, max_num_tokens=budget), colocated_policy=policy),
                       busy_requests)
        assert run.records.num_done == len(busy_requests)
        return perf.most_prompt_tokens
    longest = max(busy_requests.input_tokens)
    assert 512 < longest <= 8192
    assert 0 < most_prompt_tokens("chunked", 512) <= 512 < longest <= most_prompt_tokens("inflight", 8192)


