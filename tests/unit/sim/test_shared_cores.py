"""Shared cores (trtpd/sim/shared_cores.py): steps run longer while the host's demand exceeds its cores, and only
then; and a pulled request's first token goes out when it joins a decode step (trtpd/sim/decode_instance.py)."""

from dataclasses import replace

import numpy as np
import pytest

from trtpd.sim.events import EventLoop
from trtpd.sim.metrics import latencies
from trtpd.sim.shared_cores import SharedCores, SharedCoresSpec, share
from trtpd.sim.simulator import simulate
from trtpd.sim.workload import RequestArrays
from tests.unit.sim.fakes import LinearPerf, colocated, disagg


class _Instance:
    busy_s = 0.0


def _ends(cores: int, steps: list[tuple[float, float, float]], serving_cpu_per_token_s: float = 0.0,
          step_cores: float = 1.0, prefill_weight: float = 1.0, prefill_step_cores: float | None = None):
    """(start, work alone, tokens/s) per step, each on an instance of its own -> (end time, busy_s) of each; a step
    that streams nothing (tokens/s 0) is a prefill-only pass."""
    loop = EventLoop()
    shared = SharedCores(SharedCoresSpec(cores, serving_cpu_per_token_s, step_cores, prefill_weight,
                                         prefill_step_cores), loop)
    ends, instances = {}, [_Instance() for _ in steps]
    for i, ((start_s, alone_s, tokens_per_s), instance) in enumerate(zip(steps, instances)):
        def begin(now_s, _, i=i, instance=instance, alone_s=alone_s, tokens_per_s=tokens_per_s):
            instance.busy_s += alone_s
            shared.run(instance, now_s, alone_s, lambda end_s, _: ends.__setitem__(i, end_s), None, tokens_per_s,
                       prompt_pass=tokens_per_s == 0)
        loop.push(start_s, begin)
    loop.run()
    return [ends[i] for i in range(len(steps))], [x.busy_s for x in instances]


def test_steps_in_flight_share_the_cores_and_their_ends_move_as_demand_changes():
    # one core: 0-0.5 s the first step alone; then both at half speed until the first has done its 1 s of work
    # (at 1.5 s); the second, with 0.5 s of work done by then, finishes alone at 2.0 s
    ends, busy = _ends(1, [(0.0, 1.0, 0.0), (0.5, 1.0, 0.0)])
    assert ends == pytest.approx([1.5, 2.0]) and busy == pytest.approx([1.5, 1.5])
    ends, _ = _ends(2, [(0.0, 1.0, 0.0), (0.5, 1.0, 0.0)])     # two cores: no one waits
    assert ends == pytest.approx([1.0, 1.5])
    # the serving path: 500 tokens/s x 1 ms = 0.5 cores beside the step's own core, on one core
    ends, _ = _ends(1, [(0.0, 1.0, 500.0)], serving_cpu_per_token_s=0.001)
    assert ends == pytest.approx([1.5])
    ends, _ = _ends(2, [(0.0, 1.0, 500.0)], serving_cpu_per_token_s=0.001)
    assert ends == pytest.approx([1.0])
    with pytest.raises(ValueError, match="cores"):
        SharedCoresSpec(cores=0)


def test_a_step_beside_another_takes_step_cores_and_a_step_alone_one_core():
    """Measured on the reference fleet (trtpd profile --serving): a step beside another engine's costs more than
    its thread's core. Two steps of 1 s on two cores, the second from 0.5 s, at 1.25 cores each while both run:
    the first, alone to 0.5 s, then at 2/2.5 of its speed, ends at 0.5 + 0.5 x 1.25; the second, with 0.5 s done
    by then, ends alone 0.5 s later."""
    ends, _ = _ends(2, [(0.0, 1.0, 0.0), (0.5, 1.0, 0.0)], step_cores=1.25)
    assert ends == pytest.approx([1.125, 1.625])
    ends, _ = _ends(2, [(0.0, 1.0, 0.0), (0.0, 1.0, 0.0)], step_cores=1.25)
    assert ends == pytest.approx([1.25, 1.25])
    # alone, a step keeps one core even with the serving path beside it: 1 + 0.5 cores on two, no one waits
    ends, _ = _ends(2, [(0.0, 1.0, 500.0)], serving_cpu_per_token_s=0.001, step_cores=1.5)
    assert ends == pytest.approx([1.0])
    with pytest.raises(ValueError, match="step_cores"):
        SharedCoresSpec(cores=2, step_cores=0.9)


def test_a_prefill_only_pass_gets_its_weight_of_the_cores_against_a_step_that_streams():
    """Measured on the reference fleet: beside a decode batch a prefill ran 1.63x its time alone and the decode
    steps 1.22x (the scheduler runs the threads that wake for each token first). One core, a prefill of 1 s and a
    decode step of 1 s from 0 s, the prefill weighing 0.5: the core gives them 1/3 and 2/3 of their speed; the decode
    step ends at 1.5 s, and the prefill, with 0.5 s done by then, at 2.0 s. With equal weights both end at 2.0 s."""
    ends, busy = _ends(1, [(0.0, 1.0, 0.0), (0.0, 1.0, 100.0)], prefill_weight=0.5)
    assert ends == pytest.approx([2.0, 1.5]) and busy == pytest.approx([2.0, 1.5])
    ends, _ = _ends(1, [(0.0, 1.0, 0.0), (0.0, 1.0, 100.0)])
    assert ends == pytest.approx([2.0, 2.0])
    # two steps that stream share equally whatever the prefill weight
    ends, _ = _ends(1, [(0.0, 1.0, 100.0), (0.0, 1.0, 100.0)], prefill_weight=0.5)
    assert ends == pytest.approx([2.0, 2.0])
    # no step runs faster than alone: 2 cores, 1.5 cores per step, so the two run at 4/3 of a step's speed together;
    # at weights 0.25 and 1 the decode would get 1.07 and runs at 1, the prefill at the 1/3 left
    assert share(4 / 3, [0.25, 1.0]) == pytest.approx([1 / 3, 1.0])
    assert share(1.0, [1.0, 1.0, 2.0]) == pytest.approx([0.25, 0.25, 0.5])
    with pytest.raises(ValueError, match="prefill_weight"):
        SharedCoresSpec(cores=2, prefill_weight=0.0)


def test_two_colocated_instances_on_one_core_take_twice_as_long_as_on_two():
    perf = LinearPerf(prefill_fixed_s=0.01, decode_fixed_s=0.002)
    requests = RequestArrays([0.0, 0.0], [16, 16], [50, 50])
    alone = latencies(simulate(colocated(perf, num=2), requests), warmup_fraction=0.0)
    one = latencies(simulate(replace(colocated(perf, num=2), shared_cores=SharedCoresSpec(1)), requests),
                    warmup_fraction=0.0)
    two = latencies(simulate(replace(colocated(perf, num=2), shared_cores=SharedCoresSpec(2)), requests),
                    warmup_fraction=0.0)
    assert np.allclose(two.tpot_s, alone.tpot_s) and np.allclose(two.ttft_s, alone.ttft_s)
    # both compute every step from start to end: each step, the prefill included, takes 2x
    assert np.allclose(one.tpot_s, 2 * alone.tpot_s) and np.allclose(one.ttft_s, 2 * alone.ttft_s)


def test_the_serving_path_takes_its_cpu_per_streamed_token():
    """One instance, one sequence, 2 ms steps on one core: 500 tokens/s x 1 ms of serving CPU = 1.5 cores."""
    perf = LinearPerf(prefill_fixed_s=0.01, decode_fixed_s=0.002)
    requests = RequestArrays([0.0], [16], [100])
    base = latencies(simulate(colocated(perf), requests), warmup_fraction=0.0)
    cluster = replace(colocated(perf), shared_cores=SharedCoresSpec(1, serving_cpu_per_token_s=0.001))
    served = latencies(simulate(cluster, requests), warmup_fraction=0.0)
    assert served.tpot_s[0] == pytest.approx(1.5 * base.tpot_s[0], rel=1e-9)
    assert served.ttft_s[0] == pytest.approx(base.ttft_s[0])     # the prefill-only first step streams nothing


def test_decode_steps_slow_down_only_while_prefill_computes_on_the_same_core():
    # one request decodes alone; a second, long prompt keeps prefill busy during part of that decode
    requests = RequestArrays([0.0, 0.05], [10, 2000], [200, 1])
    cluster = disagg(LinearPerf(prefill_per_token_s=1e-4, decode_fixed_s=0.002))
    base = latencies(simulate(cluster, requests), warmup_fraction=0.0)
    shared = latencies(simulate(replace(cluster, shared_cores=SharedCoresSpec(1)), requests), warmup_fraction=0.0)
    # the long prefill starts while decode steps: it takes 2 x 0.2 s, and the decode steps that start in that
    # 0.4 s take 2x, so the decode ends 0.4 x (1 - 1/2) s later, spread over its 199 steps
    assert (shared.tpot_s[0] - base.tpot_s[0]) * 199 == pytest.approx(0.4 * (1 - 1 / 2), rel=0.05)
    assert shared.ttft_s[0] == pytest.approx(base.ttft_s[0])     # its own prefill ran alone
    assert shared.ttft_s[1] - base.ttft_s[1] == pytest.approx(0.2, rel=0.05)


def test_a_pulled_request_answers_its_first_token_when_the_decode_step_it_joins_is_done():
    """Decode steps every 10 ms for a long request; a second request's KV is in mid-step: it joins the batch when
    that step ends, and its first token goes out with the token the next step makes for it, when that step is done
    (the engine hands a step's outputs on after its pass, trtpd/engine/loop.py). An idle decode instance starts
    the step at once. With shared cores (the step's end set by the other instances' steps) the same."""
    perf = LinearPerf(prefill_per_token_s=1e-5, decode_fixed_s=0.01)
    requests = RequestArrays([0.0, 0.0234], [10, 10], [100, 5])
    for shared in (None, SharedCoresSpec(2)):
        r = simulate(replace(disagg(perf), shared_cores=shared), requests).records
        assert r.first_token_s[0] == pytest.approx(r.transfer_end_s[0] + 0.01)   # idle: its first step at once
        steps_since = (r.first_token_s[1] - r.first_token_s[0]) / 0.01
        assert r.first_token_s[1] > r.transfer_end_s[1] + 0.01 + 1e-4           # the step in flight, then its own
        assert steps_since == pytest.approx(round(steps_since), abs=1e-6)        # on a step boundary of the batch
        assert r.done_s[1] == pytest.approx(r.first_token_s[1] + 3 * 0.01)     # 5 tokens: 4 steps, the first with it


def test_a_step_beside_a_prompt_pass_takes_the_cores_measured_beside_a_prompt():
    """Colocated, the probe measures two instances decoding (step_cores) and a prompt on one beside the other's
    decode (prefill_step_cores; measured: the prompt 1.37x its pass alone, the decode steps 1.22x, so 1.20 cores per
    step where two decoding took 1.5). Two cores, a prompt-only pass and a decode step of 1 s each from 0 s: at 1.2
    cores per step both end at 1.2 s; two decode steps at 1.5 cores per step end at 1.5 s."""
    ends, _ = _ends(2, [(0.0, 1.0, 0.0), (0.0, 1.0, 100.0)], step_cores=1.5, prefill_step_cores=1.2)
    assert ends == pytest.approx([1.2, 1.2])
    ends, _ = _ends(2, [(0.0, 1.0, 100.0), (0.0, 1.0, 100.0)], step_cores=1.5, prefill_step_cores=1.2)
    assert ends == pytest.approx([1.5, 1.5])
    ends, _ = _ends(2, [(0.0, 1.0, 0.0), (0.0, 1.0, 100.0)], step_cores=1.5)    # none measured: step_cores
    assert ends == pytest.approx([1.5, 1.5])
    with pytest.raises(ValueError, match="prefill_step_cores"):
        SharedCoresSpec(cores=2, prefill_step_cores=0.5)


def test_a_colocated_step_that_computes_prompts_is_a_prompt_pass_on_the_shared_cores():
    """A colocated instance's step that computes prompts (alone, or beside its decode rows) runs its whole pass
    without a break, as a prefill instance's does: on the shared cores it weighs prefill_weight and takes
    prefill_step_cores beside the other instance's decode. Two instances on one core, routed in turn.
    - Prompts alone: the first instance decodes a long request from 0 s, the second gets a prompt at 0.1 s; with the
      prompt weighing 0.5 its step runs at a third of its speed instead of half.
    - Beside its own decode rows: both instances decode a long request, the first gets a prompt at 0.1 s; its mixed
      step (the prompt and one decode row) likewise."""
    perf = LinearPerf(prefill_fixed_s=0.02, decode_fixed_s=0.002)
    cluster = replace(colocated(perf, num=2), routing="round_robin")
    for requests, i in ((RequestArrays([0.0, 0.1], [16, 16], [400, 2]), 1),
                        (RequestArrays([0.0, 0.0, 0.1], [16, 16, 16], [400, 400, 2]), 2)):
        alone = latencies(simulate(cluster, requests), warmup_fraction=0.0)
        equal = latencies(simulate(replace(cluster, shared_cores=SharedCoresSpec(1)), requests), warmup_fraction=0.0)
        weighted = latencies(simulate(replace(cluster, shared_cores=SharedCoresSpec(1, prefill_weight=0.5)),
                                      requests), warmup_fraction=0.0)
        assert equal.ttft_s[i] == pytest.approx(2 * alone.ttft_s[i], rel=0.05), i
        assert weighted.ttft_s[i] == pytest.approx(3 * alone.ttft_s[i], rel=0.05), i


def test_the_serving_path_runs_each_requests_own_work_as_a_job_on_the_shared_cores():
    """serving_cpu_per_request_s (measured: a lone request of two tokens costs the server's processes outside the
    engine stubs 8-12 ms of CPU): a job of one thread from the request's arrival, sharing the cores as a step
    does. One core, a step of 1 s and a job of 0.5 s from 0 s: both at half speed until the job is done at 1.0 s,
    then the step, 0.5 s done, alone to 1.5 s. On two cores nothing waits."""
    for cores, step_end in ((1, 1.5), (2, 1.0)):
        loop = EventLoop()
        shared = SharedCores(SharedCoresSpec(cores), loop)
        ends, instance = [], _Instance()
        loop.push(0.0, lambda now_s, _: shared.serve(now_s, 0.5))
        loop.push(0.0, lambda now_s, _: shared.run(instance, now_s, 1.0, lambda end_s, _: ends.append(end_s)))
        loop.run()
        assert ends == pytest.approx([step_end]) and not shared.jobs
    with pytest.raises(ValueError, match="serving_cpu_per_request_s"):
        SharedCoresSpec(cores=2, serving_cpu_per_request_s=-0.001)


def test_requests_that_arrive_together_slow_the_passes_by_their_serving_work():
    """Two colocated instances on two cores, a request each at 0 s (10 ms prefill steps): alone, each first token at
    10 ms. With 5 ms of serving work per request, two steps and two jobs share the two cores at half speed until the
    jobs are done (10 ms), the steps then 5 ms short: first tokens at 15 ms. A lone request's job changes nothing
    (its step and its job, two threads on two cores)."""
    perf = LinearPerf(prefill_fixed_s=0.01, decode_fixed_s=0.002)
    both, lone = RequestArrays([0.0, 0.0], [16, 16], [4, 4]), RequestArrays([0.0], [16], [4])
    plain = replace(colocated(perf, num=2), shared_cores=SharedCoresSpec(2))
    served = replace(colocated(perf, num=2), shared_cores=SharedCoresSpec(2, serving_cpu_per_request_s=0.005))
    assert latencies(simulate(plain, both), warmup_fraction=0.0).ttft_s == pytest.approx([0.010, 0.010])
    assert latencies(simulate(served, both), warmup_fraction=0.0).ttft_s == pytest.approx([0.015, 0.015])
    assert latencies(simulate(served, lone), warmup_fraction=0.0).ttft_s == \
        pytest.approx(latencies(simulate(plain, lone), warmup_fraction=0.0).ttft_s)
