"""trtpd bench's sweep: arrival override, the same requests at every target, rate after rate, warm-up
first; --rate parsing; the one percentile function."""

import argparse

import numpy as np
import pytest
from rich.console import Console

from trtpd.bench import stats
from trtpd.bench.client import RequestResult
from trtpd.bench.report import Sweep, TargetInfo
from trtpd.bench.sweep import SweepTarget, normalize_url, run_sweep, unique_labels, with_arrival
from trtpd.cli.bench import positive_float_list
from trtpd.errors import ConfigError, TrtpdError
from trtpd.sim import metrics
from trtpd.sim.workload import generate_requests, load_workload


def target(label: str) -> SweepTarget:
    return SweepTarget(TargetInfo(label, "openai", f"http://127.0.0.1:9/{label}"), "tiny-llama", None, 2048)


def test_one_percentile_function_for_the_simulator_and_the_bench_tool():
    assert stats.percentiles is metrics.percentiles
    p = metrics.percentiles([1.0, None, float("nan"), 3.0, 2.0])
    assert (p.mean, p.p50) == (2.0, 2.0) and p.p99 == pytest.approx(np.percentile([1, 2, 3], 99))
    arr = metrics.percentiles(np.array([1.0, np.nan, 5.0]))
    assert arr.p50 == 3.0
    assert np.isnan(metrics.percentiles([]).p50)


def test_arrival_override_gamma_and_poisson():
    spec = load_workload("cpu-demo")
    assert with_arrival(spec, None, None) is spec
    g = with_arrival(spec, None, 3.0)
    assert (g.arrival.process, g.arrival.cv) == ("gamma", 3.0)
    assert with_arrival(load_workload("chat-bursty"), "gamma", None).arrival.cv == 2.0   # the workload's CV
    assert with_arrival(load_workload("chat-bursty"), "poisson", None).arrival.process == "poisson"
    with pytest.raises(ConfigError, match="give --cv"):
        with_arrival(spec, "gamma", None)
    with pytest.raises(ConfigError, match="Poisson arrivals have CV 1"):
        with_arrival(spec, "poisson", 2.0)
    # the burstier process has more variable gaps; lengths are the same draws at every rate
    gaps = {cv: np.diff(generate_requests(with_arrival(spec, "gamma", cv), 2.0, 4000, 0).arrival_s)
            for cv in (0.5, 3.0)}
    assert np.std(gaps[0.5]) / np.mean(gaps[0.5]) == pytest.approx(0.5, rel=0.1)
    assert np.std(gaps[3.0]) / np.mean(gaps[3.0]) == pytest.approx(3.0, rel=0.2)
    a, b = (generate_requests(g, rate, 50, 7) for rate in (1.0, 4.0))
    assert a.input_tokens == b.input_tokens and a.output_tokens == b.output_tokens


def test_rate_list_parsing():
    assert positive_float_list("1,2,4") == [1.0, 2.0, 4.0]
    assert positive_float_list("0.5") == [0.5]
    with pytest.raises(argparse.ArgumentTypeError, match="-3: must be a positive number"):
        positive_float_list("-3")
    with pytest.raises(argparse.ArgumentTypeError, match="every rate"):
        positive_float_list("1,0")
    with pytest.raises(argparse.ArgumentTypeError, match="twice"):
        positive_float_list("1,1")
    with pytest.raises(argparse.ArgumentTypeError):
        positive_float_list("fast")


def test_urls_and_labels():
    assert normalize_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000/v1"
    assert normalize_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000/v1"
    with pytest.raises(ConfigError):
        normalize_url("127.0.0.1:8000")
    assert [t.label for t in unique_labels([target("a"), target("a"), target("b")])] == ["a", "a #2", "b"]


def test_every_target_gets_the_same_requests_rate_after_rate_after_one_warm_up():
    from trtpd.bench.client import BenchRequest

    calls = []

    def sender(t, requests, timeout_s, on_done):
        calls.append((t.label, [r.request_id for r in requests], [r.send_at_s for r in requests]))
        out = []
        for r in requests:
            res = RequestResult(r.request_id, r.num_prompt_tokens, sent_s=0.0, token_times_s=[0.1, 0.2], done=True)
            if on_done:
                on_done(res)
            out.append(res)
        return out

    def requests_at(rate):
        return [BenchRequest(f"req-{i}", "hi", 4, i / rate, 2) for i in range(3)]

    s = Sweep("w", "poisson", 1.0, 3, 0, None, None, 0.9, [], [1.0, 2.0])
    run_sweep([target("a"), target("b")], s, requests_at, warmup=1, console=Console(quiet=True), sender=sender)
    assert [(c[0], c[1][0]) for c in calls] == [("a", "warmup-0"), ("a", "req-0"), ("b", "warmup-0"), ("b", "req-0"),
                                                ("a", "req-0"), ("b", "req-0")]
    assert calls[1][2] == calls[3][2] == [0.0, 1.0, 2.0] and calls[4][2] == calls[5][2] == [0.0, 0.5, 1.0]
    assert [(r.target, r.rate_per_s) for r in s.runs] == [("a", 1.0), ("b", 1.0), ("a", 2.0), ("b", 2.0)]


def test_a_failed_warm_up_stops_the_sweep_with_the_error():
    from trtpd.bench.client import BenchRequest

    def sender(t, requests, timeout_s, on_done):
        return [RequestResult(r.request_id, 2, error="APIConnectionError: Connection refused") for r in requests]

    s = Sweep("w", "poisson", 1.0, 1, 0, None, None, 0.9, [], [1.0])
    with pytest.raises(TrtpdError, match="warm-up request failed: APIConnectionError"):
        run_sweep([target("a")], s, lambda rate: [BenchRequest("req-0", "hi", 4, 0.0, 2)],
                  console=Console(quiet=True), sender=sender)
