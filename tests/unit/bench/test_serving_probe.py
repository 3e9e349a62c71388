"""`trtpd profile --serving`'s measurements (trtpd/bench/serving_probe.py): the decode step's serving costs from the
engines' own step periods, and the prefill scale."""

import random

import pytest

from trtpd.bench.serving_probe import MIN_PERIODS, fit_step_cores, fit_step_costs
from trtpd.perf.measured import ServingOverhead
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


def test_the_prefill_scale_is_the_servers_prefill_compute_over_the_same_pass_in_process_and_the_model_applies_it():
    from trtpd.bench.serving_probe import fit_prefill_scale
    from trtpd.perf.measured import DecodeGrid, MeasuredPerfModel, MeasuredProfile, PrefillCurve

    # the server reported 120 ms of prefill compute for a prompt whose pass took 100 ms in-process beside it
    scale = fit_prefill_scale(0.120, 0.100)
    assert scale == pytest.approx(1.2)
    with pytest.raises(ValueError, match="in-process took 0.0 s"):
        fit_prefill_scale(0.01, 0.0)
    profile = MeasuredProfile(
        model="m", decode=DecodeGrid(batch_sizes=[1], context_lens=[64], step_latency_s=[[0.002]]),
        prefill=PrefillCurve(num_tokens=[64, 1024], latency_s=[0.01, 0.1], prompt_tokens=64,
                             single_prompt_tokens=[1024], single_latency_s=[0.3]))
    alone, served = MeasuredPerfModel(profile), MeasuredPerfModel(profile, ServingOverhead(prefill_compute_scale=scale))
    for tokens, sum_sq in ((64, 64 * 64), (1024, 16 * 64 * 64), (1024, 1024 * 1024), (800, 0)):
        assert served.prefill_s(tokens, sum_sq) == pytest.approx(scale * alone.prefill_s(tokens, sum_sq))
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
    served, alone, ttfts = serving_probe._prefill_side_by_side("url", "p", 512, tmp_path, 5)
    assert serving_probe.fit_prefill_scale(served, alone) == pytest.approx(1.1)
    assert calls[:2] == [("in-process", tmp_path, (512,)), ("server", "url")] and len(calls) == 10
    assert ttfts == [0.2] * 5                       # every server request's TTFT, for the response latency
    # against a figure timed at speed 1.0, the same server read 0.11 * 0.85 / 0.1: the drift, not the server
    assert serving_probe.fit_prefill_scale(0.11 * 0.85, 0.1) == pytest.approx(0.935)


def test_the_response_latency_is_the_median_over_lone_requests_of_both_lengths():
    from trtpd.bench.serving_probe import fit_response_latency

    # (real TTFT, simulated without response latency): a slow outlier and a fast one do not move the median
    lone = [(0.040, 0.020), (0.041, 0.020), (0.090, 0.020), (0.039, 0.020), (0.130, 0.112), (0.133, 0.112),
            (0.131, 0.112), (0.112, 0.112)]
    assert fit_response_latency(lone) == pytest.approx(0.0195)
    assert fit_response_latency([(0.010, 0.020)]) == 0.0          # never negative
    with pytest.raises(ValueError, match="no lone request"):
        fit_response_latency([])
