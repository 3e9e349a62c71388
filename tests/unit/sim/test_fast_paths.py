"""The simulator's fast paths change no result: decode-only steps run inline (trtpd.sim.stepping) and KV
blocks are counted without ids (trtpd.sim.kv_blocks). Each test runs the same requests both ways and
compares every timestamp, counter and usage figure exactly, and checks that the fast path was taken."""

from dataclasses import replace

import numpy as np
import pytest

from trtpd.sched.block_allocator import BlockAllocator
from trtpd.sched.prefill import PrefillSchedulerConfig
from trtpd.sim import events
from trtpd.sim.kv_blocks import BlockCounter
from trtpd.sim.scaling import ScalingOptions
from trtpd.sim.simulator import simulate
from trtpd.sim.workload import generate_requests, load_workload
from tests.unit.sim.fakes import LinearPerf, colocated, disagg

PERF = LinearPerf(prefill_fixed_s=0.002, prefill_per_token_s=2e-5, decode_fixed_s=0.004, decode_per_seq_s=1e-4,
                  decode_per_context_token_s=2e-8)
SCHED = PrefillSchedulerConfig(max_num_tokens=4096, max_batch_size=8, min_batch_size=2)

CLUSTERS = {
    "disaggregated": disagg(PERF, num_prefill=2, num_decode=2, prefill_sched=SCHED, decode_batch=24,
                            kv_tokens=10_000, prefill_kv_tokens=6_000, link_bytes_per_s=2e9),
    "colocated-inflight": colocated(PERF, num=3, batch=24, max_num_tokens=4096, kv_tokens=10_000),
    "colocated-chunked": replace(colocated(PERF, num=3, batch=24, max_num_tokens=512, kv_tokens=10_000),
                                 colocated_policy="chunked"),
    "colocated-prefill-first": replace(colocated(PERF, num=3, batch=24, max_num_tokens=4096, kv_tokens=10_000),
                                       colocated_policy="prefill_first"),
}


def _times(values):
    return [None if v != v else v for v in values]     # NaN (not yet) compares equal to NaN


def _everything(run):
    r = run.records
    times = [_times(t) for t in (r.prefill_start_s, r.prefill_end_s, r.transfer_start_s, r.transfer_end_s,
                                 r.first_token_s, r.done_s)]
    return (times, r.prefill_instance, r.decode_instance, r.rejected, r.num_done, run.usage, run.link_busy_share,
            run.span_s, run.end_s, run.num_events, run.num_rejected, run.stopped_overloaded, run.instances,
            run.scale_events)


@pytest.fixture()
def heap_pushes(monkeypatch):
    """Counts the events that go through the heap."""
    count = [0]
    push = events.EventLoop.push

    def counted(self, time_s, handler, arg=None):
        count[0] += 1
        push(self, time_s, handler, arg)
    monkeypatch.setattr(events.EventLoop, "push", counted)
    return count


@pytest.mark.parametrize("rate_per_s", [8.0, 40.0, 120.0], ids=["idle-gaps", "busy", "overloaded"])
@pytest.mark.parametrize("name", list(CLUSTERS))
def test_inline_decode_only_steps_give_the_same_run(name, rate_per_s, heap_pushes):
    requests = generate_requests(load_workload("chat-powerlaw"), rate_per_s, 800, seed=3)
    slow = simulate(CLUSTERS[name], requests, inline_steps=False, max_in_system=400)
    pushes_slow, heap_pushes[0] = heap_pushes[0], 0
    fast = simulate(CLUSTERS[name], requests, max_in_system=400)
    assert _everything(fast) == _everything(slow)
    assert heap_pushes[0] < pushes_slow                 # the inline path was taken
    assert fast.records.num_done > 0


def test_inline_steps_with_a_scaler_give_the_same_run(heap_pushes):
    """A scaler reads each instance's busy time at its ticks and drains instances: the inline steps stop
    at every event then (the horizon is the loop's next event of any kind)."""
    def scaler(metrics):
        return {"colocated": 1 if 10.0 < metrics.now_s < 25.0 else 3}
    requests = generate_requests(load_workload("chat-powerlaw"), 6.0, 300, seed=4)
    cluster = CLUSTERS["colocated-chunked"]
    options = ScalingOptions(interval_s=2.0, window_s=4.0, startup_s=3.0)
    slow = simulate(cluster, requests, scaler=scaler, scaling=options, inline_steps=False)
    pushes_slow, heap_pushes[0] = heap_pushes[0], 0
    fast = simulate(cluster, requests, scaler=scaler, scaling=options)
    assert _everything(fast) == _everything(slow)
    assert fast.scale_events and heap_pushes[0] < pushes_slow


def test_block_counter_counts_as_the_block_allocator():
    rng = np.random.default_rng(0)
    ids, counter = BlockAllocator(500, 16), BlockCounter(500, 16)
    held: list[tuple[list[int], list[int]]] = []
    for _ in range(2000):
        if held and rng.random() < 0.45:
            a, b = held.pop(int(rng.integers(len(held))))
            ids.free(a)
            counter.free(b)
        else:
            n = int(rng.integers(0, 40))
            if not ids.can_allocate(n):
                assert not counter.can_allocate(n)
                with pytest.raises(RuntimeError, match="exhausted"):
                    counter.allocate(n)
                continue
            a, b = ids.allocate(n), counter.allocate(n)
            assert len(a) == len(b)
            held.append((a, b))
        assert (counter.num_free_blocks, counter.num_used_blocks) == (ids.num_free_blocks, ids.num_used_blocks)
    assert counter.blocks_for(33) == ids.blocks_for(33) == 3


def test_block_counter_refuses_freeing_more_than_it_lent():
    counter = BlockCounter(10, 16)
    table = counter.allocate(4)
    counter.free(table)
    counter.allocate(8)
    with pytest.raises(RuntimeError, match="double free"):
        counter.free(table * 3)       # 2 free + 12 > 10


@pytest.mark.parametrize("cooldown_s", [0.0, 3.0])
@pytest.mark.parametrize("rate_per_s", [20.0, 40.0, 70.0, 120.0])
@pytest.mark.parametrize("name", ["disaggregated", "colocated-inflight", "colocated-chunked"])
def test_a_run_stopped_once_decided_agrees_with_its_end_and_goes_on_unchanged(name, rate_per_s, cooldown_s):
    """The watch's early pass/fail is the one the whole run gives, and run() after the stop ends the run
    exactly as a run that never stopped; with a cool-down, over the same measured requests (none arriving
    in the run's last cooldown_s)."""
    from trtpd.sim.attainment import AttainmentWatch
    from trtpd.sim.metrics import summarize
    from trtpd.sim.simulator import Simulator
    cluster = replace(CLUSTERS[name], response_latency_s=0.003)
    requests = generate_requests(load_workload("chat-powerlaw"), rate_per_s, 800, seed=7)
    whole = Simulator(cluster, requests, max_in_system=400).run()
    cases = []
    tpot_p50_s = summarize(whole, 1.0, 1.0, warmup_s=2.0, cooldown_s=cooldown_s).tpot_s.p50
    arrival = whole.records.arrival_s
    # past the first 10% of requests and the first 2 s, none in the last cooldown_s
    measured = [a for i, a in enumerate(arrival)
                if i >= len(arrival) // 10 and arrival[0] + 2.0 <= a and (cooldown_s == 0 or a <= arrival[-1] - cooldown_s)]
    for ttft_s, tpot_s in [(0.2, 0.02), (0.5, 0.01), (1.0, 0.05), (100.0, tpot_p50_s)]:
        s = summarize(whole, ttft_s, tpot_s, warmup_s=2.0, cooldown_s=cooldown_s)
        assert s.num_requests == len(measured)
        attainment = s.slo_attainment or 0.0      # targets on both sides of it, and at it (knife edges)
        cases += [(ttft_s, tpot_s, t, attainment) for t in (0.5, 0.9, attainment, attainment + 0.5 / s.num_requests)]
    num_early = 0
    for ttft_s, tpot_s, target, attainment in cases:
        sim = Simulator(cluster, requests, max_in_system=400)
        watch = AttainmentWatch(sim.records, ttft_s, tpot_s, target, warmup_s=2.0, response_latency_s=0.003,
                                cooldown_s=cooldown_s)
        ended = sim.run_until_decided(watch)
        if not ended:
            assert watch.passed == (attainment >= target)
            num_early += sim.records.num_done < whole.records.num_done
        assert _everything(sim.run()) == _everything(whole)
    assert num_early or whole.stopped_overloaded       # some runs did stop early


def _roofline_chunked(max_num_tokens, batch, num=2):
    from trtpd.catalog import get_model
    from trtpd.perf.hardware import load_hardware
    from trtpd.perf.roofline import RooflinePerfModel
    perf = RooflinePerfModel(get_model("llama-2-70b"), load_hardware("h200"), tp=4)
    return replace(colocated(perf, num=num, batch=batch, max_num_tokens=max_num_tokens,
                             kv_tokens=perf.kv_capacity_tokens), colocated_policy="chunked")


CHUNKED = {
    "seed004-budget-2048": ("seed004", _roofline_chunked(2048, 64)),
    "seed004-budget-4096": ("seed004", _roofline_chunked(4096, 128)),
    "seed004-budget-below-batch": ("seed004", _roofline_chunked(40, 64)),   # steps with no budget left for chunks
    "chat-budget-256": ("chat-powerlaw", _roofline_chunked(256, 32)),
    "chat-fake-perf": ("chat-powerlaw", CLUSTERS["colocated-chunked"]),
}


@pytest.mark.parametrize("load", [0.3, 1.0, 3.0], ids=["light", "busy", "overloaded"])
@pytest.mark.parametrize("name", list(CHUNKED))
def test_inline_chunk_steps_give_the_same_run(name, load, heap_pushes, monkeypatch):
    """Chunked context: steps that compute one chunk of the head prompt and finish nothing run inline
    (ColocatedInstance._run_chunk_steps). The same run with them through the heap, and with no inline step at
    all, compared exactly."""
    from trtpd.sim.colocated_instance import ColocatedInstance
    workload, cluster = CHUNKED[name]
    rate_per_s = load * (2.0 if workload == "seed004" else 40.0)
    requests = generate_requests(load_workload(workload), rate_per_s, 400, seed=5)
    fast = simulate(cluster, requests, max_in_system=300)
    pushes_fast, heap_pushes[0] = heap_pushes[0], 0
    slow = simulate(cluster, requests, inline_steps=False, max_in_system=300)
    heap_pushes[0] = 0
    with monkeypatch.context() as m:
        m.setattr(ColocatedInstance, "_run_chunk_steps", lambda self, end_s: end_s)
        no_chunk_inline = simulate(cluster, requests, max_in_system=300)
    assert _everything(fast) == _everything(slow) == _everything(no_chunk_inline)
    assert pushes_fast < heap_pushes[0]                  # the inline chunk steps were taken
    assert fast.records.num_done > 0 or fast.stopped_overloaded


@pytest.mark.parametrize("max_in_system", [20, 45, 50])
def test_a_run_stopped_overloaded_counts_no_chunk_step_run_ahead(max_in_system, monkeypatch):
    """Chunk steps run past the next arrival (late admission) are taken back when that arrival stops the run
    as overloaded: the busy time, batch sums and step counts are those of the same run through the heap."""
    from trtpd.sim.colocated_instance import ColocatedInstance
    cluster = _roofline_chunked(512, 16, num=3)
    requests = generate_requests(load_workload("seed004"), 8.0, 400, seed=3)
    replayed = []
    rewind_to = ColocatedInstance.rewind_to

    def counted(self, now_s):
        before = self.num_steps
        rewind_to(self, now_s)
        replayed.append(before - self.num_steps)
    monkeypatch.setattr(ColocatedInstance, "rewind_to", counted)
    fast = simulate(cluster, requests, max_in_system=max_in_system)
    slow = simulate(cluster, requests, inline_steps=False, max_in_system=max_in_system)
    assert fast.stopped_overloaded and slow.stopped_overloaded
    assert _everything(fast) == _everything(slow)
    assert sum(replayed) > 0                  # some steps run ahead were taken back
