"""The simulator routes through the routing core (trtpd.routing.core.Router)."""

from dataclasses import replace

import numpy as np
import pytest

from trtpd.sched.prefill import PrefillSchedulerConfig
from trtpd.sim.simulator import Simulator, simulate
from trtpd.sim.workload import generate_requests, load_workload
from tests.unit.sim.fakes import LinearPerf, colocated, disagg

PERF = LinearPerf(prefill_fixed_s=0.002, prefill_per_token_s=2e-5, decode_fixed_s=0.004, decode_per_seq_s=1e-4,
                  decode_per_context_token_s=2e-8)
SCHED = PrefillSchedulerConfig(max_num_tokens=8192, max_batch_size=8, min_batch_size=2)
SHORT_TOKENS = 400        # about the median prompt of the chat-powerlaw workload


@pytest.fixture(scope="module")
def requests():
    return generate_requests(load_workload("chat-powerlaw"), 40.0, 1500, seed=5)


def test_bucketed_routing_keeps_long_prompts_off_the_short_bucket_instances(requests):
    # prefill-0 and prefill-1 serve prompts up to 400 tokens; prefill-2 is unbucketed (every length)
    cluster = replace(disagg(PERF, num_prefill=3, num_decode=2, prefill_sched=SCHED),
                      prefill_buckets=((SHORT_TOKENS, ("prefill-0", "prefill-1")),))
    run = simulate(cluster, requests)
    prompt = np.asarray(run.records.input_tokens)
    where = np.asarray(run.records.prefill_instance)
    long = prompt > SHORT_TOKENS
    assert long.sum() > 100 and (~long).sum() > 100                     # both kinds in the workload
    assert set(where[long]) == {2}                                      # long prompts: only prefill-2
    assert {0, 1} <= set(where[~long])                                   # short ones use their bucket
    assert run.records.num_done == len(requests) and run.num_rejected == 0


def test_a_prompt_no_bucket_serves_is_refused(requests):
    cluster = replace(disagg(PERF, num_prefill=2, prefill_sched=SCHED),
                      prefill_buckets=((SHORT_TOKENS, ("prefill-0",)), (2048, ("prefill-1",))))
    run = simulate(cluster, requests)
    prompt, where = np.asarray(run.records.input_tokens), np.asarray(run.records.prefill_instance)
    done = ~np.isnan(np.asarray(run.records.done_s))
    assert set(where[done & (prompt <= SHORT_TOKENS)]) == {0} and set(where[done & (prompt > SHORT_TOKENS)]) == {1}
    assert 0 < run.num_rejected == int((prompt > 2048).sum())


def test_router_accounting_mirrors_the_instances_and_ends_at_zero(requests):
    sim = Simulator(disagg(PERF, num_prefill=2, num_decode=3, prefill_sched=SCHED), requests)
    checks = []
    original = sim._on_prefilled

    def checked(now_s, index):     # at every hand-off, the router's view of load equals the instances'
        original(now_s, index)
        checks.append(all(sim.router.router_load(f"prefill-{p.index}").pending_prompt_tokens == p.queued_tokens
                          for p in sim.prefills) and
                      all(sim.router.router_load(f"decode-{d.index}").num_requests == d.num_assigned
                          for d in sim.decodes))
    sim._on_prefilled = checked
    for p in sim.prefills:
        p.on_prefilled = checked
    sim.run()
    assert len(checks) == len(requests) and all(checks)
    assert sim.router.num_tracked_requests == 0
    assert all(sim.router.router_load(v.name) == sim.router.router_load("nobody") for v in sim.router.instances())


@pytest.mark.parametrize("make", [
    lambda: disagg(PERF, num_prefill=2, num_decode=3, prefill_sched=SCHED, kv_tokens=20_000),
    lambda: colocated(PERF, num=3, batch=24, max_num_tokens=4096, kv_tokens=20_000),
], ids=["disaggregated", "colocated"])
def test_routing_by_free_kv_blocks_also_serves_everything(make, requests):
    run = simulate(replace(make(), decode_load="free_kv_blocks"), requests)
    assert run.records.num_done == len(requests)


def test_colocated_clusters_take_no_prefill_buckets():
    with pytest.raises(ValueError, match="colocated"):
        replace(colocated(PERF), prefill_buckets=((256, ("prefill-0",)),))
