"""The step trace through a real deployment (trtpd/engine/step_trace.py): tritonserver started under `tracing`
hands the variable to its stubs, and the engine's trace says which rows each forward pass ran and when, on the
host's one monotonic clock, which is what `trtpd profile --serving` fits the decode step's costs from
(trtpd/bench/serving_probe.py) and benchmarks/validate_sim.py --step-trace accounts a run with."""

from __future__ import annotations

import os
import time

import pytest

from trtpd.bench.client import BenchRequest, run_stream
from trtpd.bench.prompts import prompt_with_tokens
from trtpd.deploy.spec import ReferenceDeployment
from trtpd.engine import step_trace
from trtpd.fleet import deployment
from trtpd.serving import stub_watch

pytestmark = pytest.mark.e2e


def test_a_traced_engine_records_each_pass_rows_and_each_turn_on_the_hosts_clock(trtpd_home, fp16_root, tokenizer,
                                                                                tmp_path):
    lengths, max_tokens = (40, 70), 6
    with step_trace.tracing(tmp_path / "steps"):
        dep = deployment.up("e2e-step-trace", ReferenceDeployment(fp16_root, mode="colocated",
                                                                  colocated_instances=1), replace=True)
    try:
        engine_pid = next(e.pid for e in stub_watch.read_registry(dep.folder) if e.model == "colocated")
        started = time.monotonic()
        results = run_stream(dep.server.grpc_url, [
            BenchRequest(f"traced-{n}", prompt_with_tokens(tokenizer, n, seed=n), max_tokens, 0.0) for n in lengths])
        ended = time.monotonic()
    finally:
        deployment.down(dep.name)
    assert all(r.error is None and r.num_tokens >= 2 for r in results), results
    tokens = {n: r.num_tokens for n, r in zip(lengths, results)}
    traces = step_trace.read_trace(tmp_path / "steps")
    assert list(traces) == [f"colocated-engine-{engine_pid}"]          # the engine's stub, nobody else
    records = [r for r in traces[f"colocated-engine-{engine_pid}"] if started <= r["t_s"] <= ended]
    forwards = [r for r in records if r["kind"] == "forward"]
    rows = sorted(tuple(row) for f in forwards for row in f["rows"])
    # each prompt once from position 0, then a decode row per further token at the positions after it
    assert rows == sorted([(n, 0) for n in lengths] + [(1, n + k) for n in lengths for k in range(tokens[n] - 1)])
    steps = [r for r in records if r["kind"] == "step"]
    assert sum(s["outputs"] for s in steps) == sum(tokens.values())
    for f in forwards:   # every pass inside the turn of the loop that ran it
        assert any(s["t_s"] <= f["t_s"] and f["t_s"] + f["dt_s"] <= s["t_s"] + s["dt_s"] for s in steps), f
        # the engine thread's CPU in the pass (what step_account's "on core" reads), within its process's and the
        # wall time (clock ticks: the thread's CPU clock may read a little past the monotonic one on a short pass)
        assert 0 < f["cpu_s"] <= f["proc_cpu_s"] + 1e-3 and f["cpu_s"] <= f["dt_s"] + 0.02, f
        assert f["host_busy_s"] >= 0 and f["host_steal_s"] >= 0, f
    long_pass = max(forwards, key=lambda f: f["dt_s"])
    assert long_pass["cpu_s"] > 0.3 * long_pass["dt_s"], long_pass     # one thread computes: it is on a core
    # each request handed to the engine once with its prompt, its first token handed on once, after its prompt's
    # pass and before the client had it (the client's clock is the same: time.perf_counter is CLOCK_MONOTONIC)
    submits = {r["id"]: r for r in records if r["kind"] == "submit"}
    firsts = {r["id"]: r for r in records if r["kind"] == "first"}
    assert sorted(r["prompt_tokens"] for r in submits.values()) == sorted(lengths) and set(firsts) == set(submits)
    assert len([r for r in records if r["kind"] == "first"]) == len(lengths)
    for n, result in zip(lengths, results):
        (sub,) = [r for r in submits.values() if r["prompt_tokens"] == n]
        prompt_pass = next(f for f in forwards if [n, 0] in f["rows"])
        assert result.sent_s < sub["t_s"] < prompt_pass["t_s"] < firsts[sub["id"]]["t_s"] < result.token_times_s[0]
    assert step_trace.ENV not in os.environ
