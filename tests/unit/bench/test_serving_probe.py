"""`trtpd profile --serving`'s measurements (trtpd/bench/serving_probe.py): the decode step's serving costs from the
engines' own step periods, and the prefill scale."""

import random

import pytest

from trtpd.bench.serving_probe import (LONG_PROMPT_TOKENS, MIN_PERIODS, _decode_beside_prefill, _prompts_beside_decode,
                                       fit_beside_prompt, fit_per_request_cpu, fit_prefill_weight,
                                       fit_shared_demand, fit_step_cores, fit_step_costs)
from trtpd.perf.measured import ServingOverhead
from tests.unit.engine.test_step_trace import _turn
from tests.unit.sim.fakes import LinearPerf

CURVES = LinearPerf(decode_fixed_s=0.0035, decode_per_seq_s=0.0003, decode_per_context_token_s=2e-7)


def _periods(step_s, per_sequence_s, counts, hiccup_every=0, hiccup_s=0.03, seed=0):
    """What a traced engine gives: at each batch, periods of the curve's pass plus the serving costs, the
    context varying, and now and then a step that met something else (an admission, the host)."""
    rng, out = random.Random(seed), []
    for batch, count in counts.items():
        for i in range(count):
            context = batch * rng.randint(100, 300)
            period = CURVES.decode_step_s(batch, context) + step_s + per_sequence_s * batch
            if hiccup_every and i % hiccup_every == 0:
                period += hiccup_s
            out.append((batch, context, period))
    return out


def test_the_step_costs_are_the_line_through_the_periods_beyond_the_profiles_pass():
    periods = _periods(0.0003, 0.0008, {1: 60, 2: 40, 4: 30, 8: 50})
    step, per_sequence = fit_step_costs(periods, CURVES)
    assert step == pytest.approx(0.0003, abs=1e-6)
    assert per_sequence == pytest.approx(0.0008, rel=1e-3)
    # a negative intercept is kept (the engine's step at batch 1 shorter in the server than in the profile)
    assert fit_step_costs(_periods(-0.0004, 0.0008, {1: 30, 8: 30}), CURVES)[0] == pytest.approx(-0.0004, abs=1e-6)


def test_a_step_that_met_an_admission_or_a_hiccup_does_not_move_the_costs():
    """One step in five 30 ms long (a request admitted in it, the host busy): a mean per batch would put 6 ms on
    every step; the median per batch leaves the costs as they are."""
    periods = _periods(0.0003, 0.0008, {1: 60, 2: 40, 4: 30, 8: 50}, hiccup_every=5)
    step, per_sequence = fit_step_costs(periods, CURVES)
    assert step == pytest.approx(0.0003, abs=2e-4)
    assert per_sequence == pytest.approx(0.0008, rel=0.1)


def test_batch_sizes_seen_in_a_few_steps_only_are_left_out_and_one_batch_size_is_an_error():
    periods = _periods(0.0003, 0.0008, {1: 40, 8: 40}) + [(5, 1000, 0.2)] * (MIN_PERIODS - 1)
    assert fit_step_costs(periods, CURVES)[1] == pytest.approx(0.0008, rel=1e-3)
    with pytest.raises(ValueError, match=r"1 batch size\(s\) with 10 or more decode steps .*1: 40, 3: 2"):
        fit_step_costs(_periods(0.0, 0.0008, {1: 40, 3: 2}), CURVES)


def test_the_prefill_pass_in_the_server_is_a_line_through_three_lengths_and_the_model_applies_it():
    """Measured here (disaggregated, decode pulling the KV layer by layer during the pass): 23.0 / 41.9 / 93.4 ms in
    the server for prompts of 128 / 256 / 512 tokens whose passes took 17.3 / 34.6 / 83.4 in-process."""
    from trtpd.bench.serving_probe import fit_prefill_pass
    from trtpd.perf.measured import DecodeGrid, MeasuredPerfModel, MeasuredProfile, PrefillCurve

    scale, pass_s = fit_prefill_pass([(0.0173, 0.0230), (0.0346, 0.0419), (0.0834, 0.0934)])
    assert scale == pytest.approx(1.065, abs=0.005) and pass_s == pytest.approx(0.0046, abs=0.0003)
    exact = fit_prefill_pass([(0.02, 0.02 * 1.1 + 0.003), (0.05, 0.05 * 1.1 + 0.003), (0.1, 0.1 * 1.1 + 0.003)])
    assert exact == pytest.approx((1.1, 0.003))
    # a line that would cross below zero (noise at the short pass): the line through the origin
    scale, pass_s = fit_prefill_pass([(0.02, 0.018), (0.05, 0.055), (0.1, 0.112)])
    assert pass_s == 0.0 and scale == pytest.approx((0.02 * 0.018 + 0.05 * 0.055 + 0.1 * 0.112) / 0.0129)
    assert fit_prefill_pass([(0.1, 0.12)]) == pytest.approx((1.2, 0.0))   # one length: the ratio
    with pytest.raises(ValueError, match="each over 0 s"):
        fit_prefill_pass([(0.0, 0.01)])
    profile = MeasuredProfile(
        model="m", decode=DecodeGrid(batch_sizes=[1], context_lens=[64], step_latency_s=[[0.002]]),
        prefill=PrefillCurve(num_tokens=[64, 1024], latency_s=[0.01, 0.1], prompt_tokens=64,
                             single_prompt_tokens=[1024], single_latency_s=[0.3]))
    alone = MeasuredPerfModel(profile)
    served = MeasuredPerfModel(profile, ServingOverhead(prefill_compute_scale=1.1, prefill_pass_s=0.003))
    for tokens, sum_sq in ((64, 64 * 64), (1024, 16 * 64 * 64), (1024, 1024 * 1024), (800, 0)):
        assert served.prefill_s(tokens, sum_sq) == pytest.approx(1.1 * alone.prefill_s(tokens, sum_sq) + 0.003)
    assert served.prefill_s(0) == pytest.approx(1.1 * alone.prefill_s(0))   # no prompt, no pass
    assert served.decode_step_s(1, 64) == alone.decode_step_s(1, 64)


def test_the_cores_a_step_takes_beside_another_give_back_the_measured_slowdown_on_the_shared_cores():
    """Measured here: a 512-token prefill beside a decode batch of 4 took 1.46x its time alone on 2 cores, the
    decode batch's serving path taking 0.64 cores: one core per step makes (2 + 0.64) / 2 = 1.32x."""
    from trtpd.sim.events import EventLoop
    from trtpd.sim.shared_cores import SharedCores, SharedCoresSpec

    step_cores = fit_step_cores(1.46, 2, 0.64)
    assert step_cores == pytest.approx((1.46 * 2 - 0.64) / 2)
    # the simulator's shared cores, two 1 s steps together with the serving path's 0.64 cores: 1.46 s each
    loop, ends = EventLoop(), []
    shared = SharedCores(SharedCoresSpec(2, 0.001, step_cores), loop)
    for name, tokens_per_s in (("prefill", 0.0), ("decode", 640.0)):
        instance = type(name, (), {"busy_s": 0.0})()
        loop.push(0.0, lambda now_s, _, i=instance, t=tokens_per_s: shared.run(
            i, now_s, 1.0, lambda end_s, _: ends.append(end_s), None, t))
    loop.run()
    assert ends == pytest.approx([1.46, 1.46])
    # what one core per step already makes (or a host with cores to spare) needs nothing more
    assert fit_step_cores(1.30, 2, 0.64) == 1.0
    assert fit_step_cores(1.02, 8, 0.64) == 1.0
    # two steps on two cores with the serving path taking nothing: no core to spare, the slowdown is the demand
    # (measured: a colocated prompt x1.31 beside a decode x1.28, where the pair left the serving path 0 per token)
    assert fit_step_cores(1.30, 2, 0.0) == pytest.approx(1.30)
    assert fit_step_cores(1.30, 3, 0.0) == 1.0


def test_the_prefill_weight_and_step_cores_give_back_both_slowdowns_measured_beside_each_other():
    """Measured here: a 512-token prefill beside a decode batch of 4 took 1.63x its time alone, the decode steps
    beside it 1.22x, the serving path taking 0.69 of the 2 cores. The simulator's shared cores, a prefill of 1 s
    beside a long decode step, with the fitted weight and step cores: the prefill ends at 1.63 s, having left the
    decode 1.63 / 1.22 s of its work done."""
    from trtpd.sim.events import EventLoop
    from trtpd.sim.shared_cores import SharedCores, SharedCoresSpec

    weight = fit_prefill_weight(1.63, 1.22)
    assert weight == pytest.approx(1.22 / 1.63)
    step_cores = fit_step_cores(2.0 / (1 / 1.63 + 1 / 1.22), 2, 0.69)
    # what the probe calls for both (the disaggregated prefill, and a colocated prompt beside the other's decode)
    assert fit_beside_prompt(1.63, 1.22, 2, 0.69) == pytest.approx((weight, 2.0 / (1 / 1.63 + 1 / 1.22), step_cores))
    loop, ends = EventLoop(), {}
    shared = SharedCores(SharedCoresSpec(2, 0.001, step_cores, weight), loop)
    for name, work_s, tokens_per_s in (("prefill", 1.0, 0.0), ("decode", 10.0, 690.0)):
        instance = type(name, (), {"busy_s": 0.0})()
        loop.push(0.0, lambda now_s, _, i=instance, w=work_s, t=tokens_per_s, n=name: shared.run(
            i, now_s, w, lambda end_s, _, n=n: ends.__setitem__(n, end_s), None, t, prompt_pass=t == 0))
    loop.run()
    assert ends["prefill"] == pytest.approx(1.63)
    assert ends["decode"] == pytest.approx(1.63 + 10.0 - 1.63 / 1.22)
    # a decode not slowed counts as 1; a prefill that lost no more than the decode shares equally
    assert fit_prefill_weight(1.5, 0.95) == pytest.approx(1 / 1.5)
    assert fit_prefill_weight(1.2, 1.4) == 1.0


def _pass(t_s, dt_s, rows):
    return {"kind": "forward", "t_s": t_s, "dt_s": dt_s, "rows": rows}


def test_the_decode_slowdown_beside_the_prefill_is_the_steps_inside_its_passes_over_the_steps_apart_from_them():
    """Within the phase's span (not the lone phase before it): the decode engine's turns at the phase's batch that
    start and end inside one of the prefill engine's passes over the long prompt, against its turns at that batch
    apart from them (the baseline in the same minute), each period over the step's time alone."""
    alone_s = lambda batch, context: 0.010                               # noqa: E731

    def phase(scale):
        prefill = [_pass(0.5, 1.0, [[LONG_PROMPT_TOKENS, 0]]),            # the lone phase: before the span
                   _pass(2.0, 0.2, [[100, 0]]),                           # the decode batch's own prompt
                   _pass(3.0, 0.3, [[LONG_PROMPT_TOKENS, 0]])]
        inside = [r for i in range(MIN_PERIODS + 1)
                  for r in _turn(3.0 + 0.015 * scale * i, 0.012, [[1, 100 + i]] * 4)]
        apart = [r for i in range(20) for r in _turn(2.0 + 0.010 * scale * i, 0.008, [[1, 50 + i]] * 4)]
        forming = [r for i in range(20) for r in _turn(1.9 + 0.004 * i, 0.003, [[1, 40 + i]] * 2)]   # batch 2
        lone = [r for i in range(20) for r in _turn(0.5 + 0.015 * i, 0.005, [[1, 10 + i]] * 4)]
        return {"prefill-engine-1": prefill, "decode-engine-2": lone + forming + apart + inside}, prefill, apart

    records, prefill, apart = phase(1.0)
    slowdown, steps = _decode_beside_prefill(records, (1.9, 4.0), 4, alone_s)
    # inside 15 ms, apart 10 ms (the last inside turn's next turn is not inside: left out; batch 2 turns too)
    assert steps == MIN_PERIODS and slowdown == pytest.approx(1.5)
    # the machine 20% slower in this minute: both move, the slowdown does not
    assert _decode_beside_prefill(phase(1.2)[0], (1.9, 4.0), 4, alone_s)[0] == pytest.approx(1.5)
    with pytest.raises(RuntimeError, match="decode steps at batch 4 beside"):
        _decode_beside_prefill({"prefill-engine-1": prefill, "decode-engine-2": apart}, (1.9, 4.0), 4, alone_s)
    # a span that ends before the pass (another load's phase) has none of its steps
    with pytest.raises(RuntimeError, match="decode steps at batch 4 beside"):
        _decode_beside_prefill(records, (1.9, 2.9), 4, alone_s)
    # no steps apart from the passes: no baseline
    with pytest.raises(RuntimeError, match="0 apart from them"):
        _decode_beside_prefill(records, (2.5, 4.0), 4, alone_s)


def test_the_prefill_scale_is_timed_in_turns_so_the_machines_speed_cancels(monkeypatch, tmp_path):
    """The machine's speed moves between minutes: the probe read 0.87 against the profile's figure in one run and
    1.01 in the next. Timed in turns with the same pass in-process, a server 1.1x slower than in-process reads 1.1
    whatever the speed does from round to round."""
    from trtpd.bench import serving_probe
    from trtpd.engine import profiling

    speeds = iter([1.0, 1.0, 0.8, 0.8, 1.3, 1.3, 0.9, 0.9, 0.85, 0.85])   # each round's pair shares its speed
    calls = []
    monkeypatch.setattr(profiling, "measure_prefill_s",
                        lambda d, lens, repeats=3: calls.append(("in-process", d, tuple(lens))) or 0.1 * next(speeds))
    monkeypatch.setattr(serving_probe, "_lone_prefill",
                        lambda url, prompt, tag: calls.append(("server", url)) or (0.11 * next(speeds), 0.2))
    alone, ttfts = serving_probe._prefill_side_by_side("url", "p", 512, tmp_path, 5)
    # each server request right after its in-process twin, at the same minute's speed (the trace times its pass)
    assert calls == [("in-process", tmp_path, (512,)), ("server", "url")] * 5
    assert alone == pytest.approx(0.1 * 0.9)        # the median over the rounds' speeds 1.0, 0.8, 1.3, 0.9, 0.85
    assert ttfts == [0.2] * 5                       # every server request's TTFT, for the response latency


def test_the_response_latency_is_the_median_over_lone_requests_of_both_lengths():
    from trtpd.bench.serving_probe import fit_response_latency

    # (real TTFT, simulated without response latency, the traced pass beyond the simulated): a slow outlier and a
    # fast one do not move the median
    lone = [(0.040, 0.020, 0.0), (0.041, 0.020, 0.0), (0.090, 0.020, 0.0), (0.039, 0.020, 0.0), (0.130, 0.112, 0.0),
            (0.133, 0.112, 0.0), (0.131, 0.112, 0.0), (0.112, 0.112, 0.0)]
    assert fit_response_latency(lone) == pytest.approx(0.0195)
    assert fit_response_latency([(0.010, 0.020, 0.0)]) == 0.0          # never negative
    # the machine 30% slower than when the curves were timed: every pass (20 and 112 ms simulated) took 30% longer
    # in the server, and so did the TTFTs by as much; the path outside the pass is the same
    slower = [(real + 0.3 * sim, sim, 0.3 * sim) for real, sim, _ in lone]
    assert fit_response_latency(slower) == pytest.approx(0.0195)
    with pytest.raises(ValueError, match="no lone request"):
        fit_response_latency([])


def test_every_lone_request_meets_a_server_that_idled_as_at_light_load(monkeypatch, tmp_path):
    """Measured here: 100-token requests back to back took 40.1 ms to the first token, 0.1-1 s apart 44.0-45.1 ms; a
    workload's requests at 1-3/s meet an idle server, so the probe's lone requests (the response latency) wait
    LONE_IDLE_S before each, and so does each of its long prompts timed in turns."""
    from trtpd.bench import serving_probe
    from trtpd.bench.client import RequestResult
    from trtpd.engine import profiling

    events = []
    monkeypatch.setattr(serving_probe.time, "sleep", lambda s: events.append(("idle", s)))

    def stream(url, reqs):
        events.append(("send", len(reqs)))
        return [RequestResult(r.request_id, 100, 0.0, [0.04, 0.045, 0.05]) for r in reqs]

    monkeypatch.setattr(serving_probe, "run_stream", stream)
    ttft, _ = serving_probe._real_samples("url", ["p"], 3, idle_before_s=serving_probe.LONE_IDLE_S)
    assert ttft == [0.04] * 3
    assert events == [("idle", serving_probe.LONE_IDLE_S), ("send", 1)] * 3 and serving_probe.LONE_IDLE_S >= 0.1
    events.clear()
    monkeypatch.setattr(profiling, "measure_prefill_s", lambda d, lens, repeats=3: events.append(("alone",)) or 0.1)
    monkeypatch.setattr(serving_probe, "_lone_prefill",
                        lambda url, prompt, tag: events.append(("send", 1)) or (0.1, 0.2))
    serving_probe._prefill_side_by_side("url", "p", 512, tmp_path, 2)
    assert events == [("alone",), ("idle", serving_probe.LONE_IDLE_S), ("send", 1)] * 2


def test_the_colocated_pairs_slowdown_at_two_loads_gives_the_cores_a_step_takes_and_what_the_serving_path_takes():
    """Measured here (2 cores): two colocated instances decoding 1 and 4 each ran 1.41x and 1.53x their steps alone,
    streaming 496 and 1,065 tokens/s alone; the serving path spent 1.27 ms of CPU per token (/proc), which as a
    demand on the cores would make 1.31x and 1.68x. The line through both points: what the serving path takes from
    the engines per token, and what a step takes beside another. The simulator's shared cores, two 1 s decode steps
    streaming as measured, give back both slowdowns."""
    from trtpd.sim.events import EventLoop
    from trtpd.sim.shared_cores import SharedCores, SharedCoresSpec

    points = [(496.0, 1.41), (1065.0, 1.53)]
    step_cores, per_token_s = fit_shared_demand(points, 2, 0.00127)
    assert per_token_s == pytest.approx((1.53 - 1.41) * 2 / (1065 - 496))   # 0.42 ms: a third of the CPU it spends
    assert step_cores == pytest.approx((1.41 * 2 - per_token_s * 496) / 2)
    for tokens_per_s, slowdown in points:
        loop, ends = EventLoop(), []
        shared = SharedCores(SharedCoresSpec(2, per_token_s, step_cores), loop)
        for name in ("first", "second"):
            instance = type(name, (), {"busy_s": 0.0})()
            loop.push(0.0, lambda now_s, _, i=instance: shared.run(
                i, now_s, 1.0, lambda end_s, _: ends.append(end_s), None, tokens_per_s / 2))
        loop.run()
        assert ends == pytest.approx([slowdown, slowdown])
    # the serving path takes at most what it spends, and nothing where the slowdown does not grow with its load
    step_cores, per_token_s = fit_shared_demand([(496.0, 1.31), (1065.0, 1.80)], 2, 0.00127)
    assert per_token_s == 0.00127
    assert step_cores == pytest.approx(((1.31 * 2 - 0.00127 * 496) + (1.80 * 2 - 0.00127 * 1065)) / 4)
    step_cores, per_token_s = fit_shared_demand([(496.0, 1.55), (1065.0, 1.50)], 2, 0.00127)
    assert per_token_s == 0.0 and step_cores == pytest.approx((1.55 + 1.50) / 2)
    # one load alone: the per-token CPU as spent, and the step cores as fit_step_cores gives them
    assert fit_shared_demand([(1065.0, 1.80)], 2, 0.00127) == pytest.approx(
        (fit_step_cores(1.80, 2, 0.00127 * 1065), 0.00127))
    # a slowdown that one core per step already makes needs no more than a core
    assert fit_shared_demand([(496.0, 1.0), (1065.0, 1.05)], 2, 0.00127)[0] == 1.0


def test_a_colocated_prompt_alone_in_its_pass_is_timed_beside_the_other_instances_decode_steps_inside_it():
    """The colocated pair's prompts: first alone on the idle pair (the baseline in the same minute), then beside a
    decode. Triton alternates the instances, so every other prompt runs alone in its pass on the idle instance
    (timed) and every other one in a step with the decode (not a prompt-only pass: left out); the decode steps
    counted are the other instance's inside the timed passes, against its steps apart from them."""
    alone_s = lambda batch, context: 0.010                               # noqa: E731

    def pair(scale):
        # the idle pair: a prompt alone on each instance in turn, 0.1 s each
        a = [_pass(0.1, 0.1 * scale, [[LONG_PROMPT_TOKENS, 0]])]
        b = [_pass(0.3, 0.1 * scale, [[LONG_PROMPT_TOKENS, 0]])]
        # then instance A decodes 1 sequence: 10 ms periods apart from B's prompts, 15 ms inside them; its own
        # prompts' steps are mixed (a prompt and the decode row)
        t, turns = 1.0, []
        while t < 1.9:
            inside = 1.05 <= t < 1.2 or 1.3 <= t < 1.45
            turns += _turn(t, 0.008, [[1, 100 + len(turns)]])
            t += (0.015 if inside else 0.010) * scale
        a += turns + [_pass(1.5, 0.2, [[LONG_PROMPT_TOKENS, 0], [1, 140]])]
        # instance B: prompts alone in their pass, 0.15 s each (the third ends after the phase: left out)
        b += [_pass(1.05, 0.15 * scale, [[LONG_PROMPT_TOKENS, 0]]), _pass(1.3, 0.15 * scale, [[LONG_PROMPT_TOKENS, 0]]),
              _pass(1.85, 0.2, [[LONG_PROMPT_TOKENS, 0]])]
        return {"colocated-engine-1": a, "colocated-engine-2": b}

    spans = ((0.0, 0.9), (1.0, 1.8))
    prompt, slowdown, steps = _prompts_beside_decode(pair(1.0), spans, alone_s)
    assert prompt == pytest.approx(1.5)                      # 0.15 s beside the decode, 0.1 s on the idle pair
    assert slowdown == pytest.approx(1.5, rel=0.05) and steps >= MIN_PERIODS   # A's turns: 15 ms inside, 10 apart
    # the machine 20% slower in this minute: every pass and step moves, the slowdowns do not
    later = _prompts_beside_decode(pair(1.2), spans, alone_s)
    assert later[0] == pytest.approx(prompt) and later[1] == pytest.approx(slowdown, rel=0.05)
    with pytest.raises(RuntimeError, match="prompts of"):
        _prompts_beside_decode({"colocated-engine-1": pair(1.0)["colocated-engine-1"]}, spans, alone_s)
    with pytest.raises(RuntimeError, match="0 prompts of 512 tokens alone on the idle pair"):
        _prompts_beside_decode(pair(1.0), ((0.5, 0.9), (1.0, 1.8)), alone_s)


def test_the_per_request_cpu_is_the_servers_cpu_less_its_idle_cpu():
    """Six lone requests over 3 s: the server's processes outside the engine stubs spent 0.20 s, 0.02 s a second
    while idle: (0.20 - 0.06) / 6 = 23.3 ms a request. More idle CPU than was spent reads 0, not negative."""
    assert fit_per_request_cpu(0.20, 0.02, 3.0, 6) == pytest.approx(0.14 / 6)
    assert fit_per_request_cpu(0.05, 0.02, 3.0, 6) == 0.0
    with pytest.raises(ValueError, match="per-request"):
        fit_per_request_cpu(0.20, 0.02, 0.0, 6)
