"""Measure what serving adds to the engine's forward passes, through the real tritonserver.

A small probe, one engine instance per role: requests of one length sent at once in batches of 1, 2, 4 and 8,
streamed over gRPC, with the engines tracing their steps (trtpd/engine/step_trace.py). The serving overhead:
- the decode step's costs (step_overhead_s + per_sequence_step_s x batch): each real decode step's period beyond
  the profile's forward pass at that batch and context, a line against the batch (the response pipeline's work in
  the engine's own process: handing each sequence's token on slows the pass, ~0.8 ms per sequence here),
- the prefill pass in the server: prompts of 128, 256 and 512 tokens, each alone in its batch, the pass as the
  engine's trace timed it against the same pass timed in this process in turns with it (so that the machine's
  speed, which moves between minutes, cancels out), a line through the three (a scale and a cost per pass:
  disaggregated, decode pulls the prompt's KV layer by layer while the pass runs; fit_prefill_pass),
- a response latency (request path: pre/post-processing, orchestrator, hops): lone requests' real TTFT beyond
  the simulated one, the median over both prompt lengths,
- the serving path's CPU: while the batch of 8 runs, the CPU the rest of the deployment and the client spend
  (every process of the server's group but the engines' stubs, and this process, which is the client then) is
  read from /proc; per streamed token, it is the serving path's share of the host's cores, which the simulator's
  shared cores take from the engines when the host is oversubscribed (`host_cores`, `serving_cpu_per_token_s`;
  trtpd/sim/shared_cores.py),
- the serving path's CPU per request beyond its tokens: lone requests of PER_REQUEST_TOKENS tokens, the CPU of
  the server's group but the engine stubs from /proc, less what those processes spend idle; per request, the
  simulator's job on the shared cores from the request's arrival (`serving_cpu_per_request_s`). It leaves the
  per-token figure, whose batch of 8 ran BIG_BATCH x rounds requests,
- what a step costs beside another engine's (`step_cores`, and `prefill_weight`): disaggregated, a long prefill
  beside a decode batch; colocated, a second deployment of two instances decoding 1, 2 and then 4 requests each,
  the line through the loads' slowdowns (fit_shared_demand: the serving path's share per token, at most its CPU from
  /proc, and the cores a step takes). Each slowdown against its baseline in the same minute (the prefill alone
  just before, the decode steps apart from the prefill's passes).
The validation workload (`benchmarks/validate_sim.py`) is a different, loaded scenario.
"""

from __future__ import annotations

import math
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any
from dataclasses import replace
from pathlib import Path

import numpy as np

from trtpd.bench.client import BenchRequest, run_stream
from trtpd.bench.proc_cpu import cpu_s, group_pids
from trtpd.bench.prompts import prompt_with_tokens
from trtpd.catalog import get_model
from trtpd.engine import step_trace
from trtpd.engine.checkpoint import load_checkpoint
from trtpd.perf.hardware import HardwareProfile
from trtpd.perf.measured import ServingOverhead
from trtpd.perf.model import instance_perf
from trtpd.deploy.spec import ReferenceDeployment
from trtpd.fleet import deployment
from trtpd.serving import stub_watch
from trtpd.sim.cluster_specs import ClusterOptions, colocated_cluster, disaggregated_cluster, options_from_engines
from trtpd.sim.metrics import latencies
from trtpd.sim.simulator import simulate
from trtpd.sim.workload import RequestArrays

PROMPT_TOKENS, OUTPUT_TOKENS, BIG_BATCH = 100, 64, 8
LONG_PROMPT_TOKENS = 512   # the prefill scale's scenario: one such prompt at a time (~0.1 s of one engine's compute)
LONG_PROMPT_ROUNDS = 5     # its median beside a decode batch (step_cores)
PASS_PROMPT_TOKENS = (128, 256, LONG_PROMPT_TOKENS)   # the prefill pass in the server against in-process: a
# line through these lengths (fit_prefill_pass), each alone in its batch, LONE_ROUNDS of each
LONE_ROUNDS = 6            # lone requests of each length (PROMPT_TOKENS, LONG_PROMPT_TOKENS): the response latency
# each lone request meets a server that idled this long, as a workload's requests do at light load: measured on the
# 2-core reference fleet, 100-token requests back to back took 40.1 ms to the first token, 0.1-1 s apart 44.0-45.1
LONE_IDLE_S = 0.3
ENGINE_MODELS = ("prefill", "decode", "colocated")   # the role models whose stubs run the engines (repo/reference.py)
MIN_PERIODS = 10            # decode steps at one batch size for its point on the step costs' line
STEP_BATCHES = (2, 4)       # with 1 and BIG_BATCH: the batch sizes the step costs' line goes through
CONTENTION_BATCH = 4        # the decode batch beside which a step's cost is measured (step_cores)
PAIR_BATCHES = (1, 2, CONTENTION_BATCH)   # colocated: two instances decoding this many each, a line through them
CONTENTION_TOKENS = 300     # its output: long enough to outlast the prefills measured beside it
PAIR_SPACING_S = 0.02       # between the requests for two colocated instances, so each gets every other one
CONTENTION_SETTLE_S = 0.3   # the batch is formed (its requests admitted one by one) before anything is timed
PER_REQUEST_TOKENS = 2      # lone requests for the serving path's CPU per request: the first token and one decoded
# (disaggregated, decode pulls the KV), so that every hop a request takes runs
PER_REQUEST_ROUNDS = 30     # of them, one after another: /proc counts CPU in ticks of 10 ms per process, so six
# requests 0.3 s apart read 6.5-16.5 ms a request in four runs; back to back the idle CPU subtracted is small too
IDLE_READ_S = 1.0           # the server's processes' CPU while idle (their loops poll), read over this long first
BESIDE_PROMPTS_TOKENS = 500  # colocated: the output (max_tokens is at most 512) of the one request decoding while
#                              prompts run on the other instance


def _real_samples(url: str, prompts: list[str], rounds: int,
                  output_tokens: int = OUTPUT_TOKENS, idle_before_s: float = 0.0) -> tuple[list[float], list[float]]:
    """Every request's TTFT and TPOT over `rounds` rounds of len(prompts) requests sent at once, each round after
    the server idled `idle_before_s`."""
    ttft, tpot = [], []
    for r in range(rounds):
        time.sleep(idle_before_s)
        reqs = [BenchRequest(f"probe-{len(prompts)}-{r}-{i}", p, output_tokens, 0.0) for i, p in enumerate(prompts)]
        for res in run_stream(url, reqs):
            if res.error:
                raise RuntimeError(f"serving probe request failed: {res.error}")
            ttft.append(res.ttft_s)
            tpot.append(res.tpot_s)
    return ttft, tpot


def _real(url: str, prompts: list[str], rounds: int, output_tokens: int = OUTPUT_TOKENS) -> tuple[float, float]:
    """Median TTFT and TPOT over `rounds` rounds of len(prompts) requests sent at once."""
    ttft, tpot = _real_samples(url, prompts, rounds, output_tokens)
    return statistics.median(ttft), statistics.median(tpot)


def _lone_prefill(url: str, prompt: str, tag: str) -> tuple[float, float]:
    """One request for `prompt` alone in its batch (output 1): the prefill compute the engine reports (its perf
    output, PERF_OUTPUTS) and the request's TTFT, seconds."""
    (res,) = run_stream(url, [BenchRequest(f"probe-long-{tag}", prompt, 1, 0.0)])
    if res.error:
        raise RuntimeError(f"serving probe request failed: {res.error}")
    if "prefill_compute_ms" not in res.perf:
        raise RuntimeError("serving probe: the response carries no prefill_compute_ms perf output")
    return res.perf["prefill_compute_ms"] / 1e3, res.ttft_s


def _real_prefill_compute(url: str, prompt: str, rounds: int) -> float:
    """Median prefill compute the engine reports for one prompt at a time: each request alone in its batch, so that
    the pass is the one the profile timed."""
    return statistics.median(_lone_prefill(url, prompt, str(r))[0] for r in range(rounds))


def _prefill_side_by_side(url: str, prompt: str, num_tokens: int, engine_dir: Path,
                          rounds: int) -> tuple[float, list[float]]:
    """Median seconds of one prompt's prefill pass (`prompt`, `num_tokens` ids) in this process on the same engine
    folder, timed in turns with the same prompt sent alone to the server (whose pass the engine's step trace times):
    the machine's speed, which moves by 10-30% between minutes here, is the same for both, so their ratio is the
    serving process's own (the profile's figure for the prompt was timed minutes before; against it the probe read
    0.87 in one run and 1.01 in the next). Also every server request's TTFT."""
    from trtpd.engine.profiling import measure_prefill_s

    alone, ttfts = [], []
    for r in range(rounds):
        alone.append(measure_prefill_s(engine_dir, [num_tokens], 1))
        time.sleep(LONE_IDLE_S)
        ttfts.append(_lone_prefill(url, prompt, f"turn-{r}")[1])
    return statistics.median(alone), ttfts


def warm_every_instance(url: str, prompt: str, num_instances: int, max_tokens: int = 1) -> None:
    """An engine's first pass over a prompt longer than any it has run is slower (measured on a colocated
    instance: 231 ms for 512 tokens, then 97-133 ms): `prompt` runs once on each of the entry role's
    `num_instances` before anything is timed. Triton hands an instance group's requests to its instances in turn
    (tests/e2e/test_instance_dispatch.py), so one request each reaches them all."""
    for i in range(num_instances):
        (res,) = run_stream(url, [BenchRequest(f"warmup-long-{i}", prompt, max_tokens, 0.0)])
        if res.error:
            raise RuntimeError(f"warm-up request failed: {res.error}")


def _simulated(cluster, batch: int, prompt_tokens: int = PROMPT_TOKENS,
               output_tokens: int = OUTPUT_TOKENS) -> tuple[float, float]:
    """Median simulated TTFT and TPOT of `batch` requests sent at once (TPOT NaN at one output token)."""
    arrays = RequestArrays([0.0] * batch, [prompt_tokens] * batch, [output_tokens] * batch)
    lat = latencies(simulate(cluster, arrays), warmup_fraction=0.0)
    return float(statistics.median(lat.ttft_s)), float(statistics.median(lat.tpot_s))


def fit_step_costs(periods: list[tuple[int, int, float]], curves) -> tuple[float, float]:
    """(step_overhead_s, per_sequence_step_s): a line against the batch through what the real decode steps'
    periods (trtpd.engine.step_trace.decode_periods: batch, context tokens, seconds) have beyond the profile's
    forward pass at that batch and context (`curves`: the measured perf model without serving costs). Each batch
    size seen in at least MIN_PERIODS steps gives one point, its median (a step that also admitted a request, or
    met a hiccup of the host, is not a decode step's cost), weighted by its count.
    Measured in the server's engine, step by step, where the previous probe fitted client TPOTs through the
    simulator: that fit read batches the serving path forms one request at a time as whole (and the colocated
    batch of 8 split over two instances), and gave 0.41 ms per sequence colocated where the traced steps show
    0.7-0.9 (docs/simulator-fidelity.md). The intercept is often negative: the steps grow faster from batch 1 to 2
    than beyond."""
    by_batch: dict[int, list[float]] = {}
    for batch, context, period in periods:
        by_batch.setdefault(batch, []).append(period - curves.decode_step_s(batch, context))
    points = {b: (float(np.median(x)), len(x)) for b, x in by_batch.items() if len(x) >= MIN_PERIODS}
    if len(points) < 2:
        raise ValueError(f"serving probe: {len(points)} batch size(s) with {MIN_PERIODS} or more decode steps in "
                         f"the trace ({', '.join(f'{b}: {len(x)}' for b, x in sorted(by_batch.items())) or 'none'}); "
                         f"the per-sequence cost needs two or more")
    batches = sorted(points)
    per_sequence, step = np.polyfit(batches, [points[b][0] for b in batches], 1,
                                    w=[np.sqrt(points[b][1]) for b in batches])
    return float(step), float(max(0.0, per_sequence))


def fit_response_latency(lone: list[tuple[float, float, float]]) -> float:
    """The serving path's time around a request (pre/post-processing, the orchestrator, Triton's hops): the median,
    over lone requests (nothing else in the server), of the real TTFT beyond the simulated one for that request
    without any response latency, the simulated pass replaced by the server's own as the engine's trace timed it;
    (real TTFT, simulated TTFT, the traced pass's median for that prompt length beyond the simulated pass), seconds.
    Pooled over two prompt lengths (100 and 512 tokens), LONE_ROUNDS of each: three requests of one length read 7.8
    ms in one run and 20.7 ms in another. The pass is the server's because the machine's speed moves between the
    minute the profile's curves were timed and the probe's: in a run whose engine ran a 512-token pass in 145 ms
    where the curves said 114, the latency read +38 ms against the simulated pass (2026-12-06 03:11), where the
    path outside the pass takes 10-20."""
    if not lone:
        raise ValueError("no lone request to read the response latency from")
    return max(0.0, float(statistics.median(real - sim - pass_beyond for real, sim, pass_beyond in lone)))


def fit_prefill_pass(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(prefill_compute_scale, prefill_pass_s): the line through (the pass timed in-process, the same pass as the
    engine's trace timed it in the server), one point per prompt length, each alone in its batch and the two timed in
    turns (_prefill_side_by_side: the machine's speed, which moves between minutes, is the same for both). The
    server's pass costs more than the engine's own work in proportion and per pass: disaggregated, decode pulls the
    prompt's KV layer by layer while the pass runs (measured on the 2-core reference fleet: 23.0 / 41.9 / 93.4 ms
    for 128 / 256 / 512 tokens against 17.3 / 34.6 / 83.4 in-process, x1.07 + 4.6 ms; colocated 19.7 / 39.6 / 89.3
    against 16.9 / 35.2 / 82.8, x1.06 + 1.9 ms). The prefill compute the engine reports read only x1.05 there:
    disaggregated it is what decode waited for from the pull's start, not the pass. A negative intercept (the
    machine's noise at short passes) gives the line through the origin."""
    if not points or any(in_process <= 0 for in_process, _ in points):
        raise ValueError(f"prefill passes timed in-process and in the server: {points}; one or more, each over 0 s")
    x, y = np.array(points, dtype=float).T
    if len(points) > 1 and np.ptp(x) > 0:
        scale, pass_s = np.polyfit(x, y, 1)
        if pass_s >= 0 and scale > 0:
            return float(scale), float(pass_s)
    return float(np.dot(x, y) / np.dot(x, x)), 0.0


def _with_serving(hardware: HardwareProfile, mode: str, overhead: ServingOverhead) -> HardwareProfile:
    return hardware.model_copy(update={"measured": [m.model_copy(update={"serving": {**m.serving, mode: overhead}})
                                                    for m in hardware.measured]})


def serving_cpu_reader(dep: deployment.Deployment, client: bool = True) -> Callable[[], float]:
    """A reading of the CPU seconds spent so far outside the engines: the server's group but the engine stubs
    (tritonserver, the orchestrator and pre/post-processing stubs), and this process (the client) unless
    client=False."""
    engines = {e.pid for e in stub_watch.read_registry(dep.folder) if e.model in ENGINE_MODELS}
    if not engines:
        raise RuntimeError(f"serving probe: no engine stub of {', '.join(ENGINE_MODELS)} in {dep.folder}/stubs")
    others = [pid for pid in group_pids([dep.server.pid]) if pid not in engines]
    return (lambda: cpu_s(others) + time.process_time()) if client else (lambda: cpu_s(others))


def _per_request_cpu(url: str, prompt: str, server_cpu: Callable[[], float]) -> float:
    """The serving path's CPU per request beyond its tokens (fit_per_request_cpu): the server's processes outside
    the engine stubs idle for IDLE_READ_S, then serve PER_REQUEST_ROUNDS requests of PER_REQUEST_TOKENS tokens, each
    alone, one after another."""
    time.sleep(LONE_IDLE_S)
    idle_from, idle_before = time.monotonic(), server_cpu()
    time.sleep(IDLE_READ_S)
    started, before = time.monotonic(), server_cpu()
    idle_cpu_per_s = (before - idle_before) / (started - idle_from)
    _real_samples(url, [prompt], PER_REQUEST_ROUNDS, PER_REQUEST_TOKENS)
    return fit_per_request_cpu(server_cpu() - before, idle_cpu_per_s, time.monotonic() - started,
                               PER_REQUEST_ROUNDS)


def fit_per_request_cpu(cpu_s: float, idle_cpu_per_s: float, wall_s: float, num_requests: int) -> float:
    """The serving path's CPU per request, seconds: what the server's processes outside the engine stubs spent
    over `wall_s` of lone requests (`cpu_s`) less what they spend idle over as long (`idle_cpu_per_s`: their loops
    poll), per request. Outside the engine stubs, as the per-token figure: the engine stubs' own serving work is in
    their steps' periods and passes (the step costs, prefill_pass_s). Measured on the 2-core reference fleet, 30
    requests one after another: 10.8-14.6 ms disaggregated, 7.4-11.2 colocated (2026-12-06)."""
    if num_requests < 1 or wall_s <= 0:
        raise ValueError(f"per-request CPU: {num_requests} requests over {wall_s} s; one or more over a span")
    return max(0.0, (cpu_s - idle_cpu_per_s * wall_s) / num_requests)


def fit_step_cores(slowdown: float, host_cores: int, serving_cores: float, steps: int = 2) -> float:
    """The step_cores (ServingOverhead) that make the simulator's shared cores slow `steps` steps in flight by the
    measured `slowdown`, the serving path taking `serving_cores` of the host meanwhile: steps x step_cores +
    serving_cores = slowdown x host_cores. 1 where one core per step already makes that slowdown or more, and where
    one core per step leaves host cores to spare: a slowdown there is not the sharing of too few cores, and no
    demand would make the simulator's sharing reproduce it. Where the steps take every core (two on two, the
    serving path taking none), the demand beyond them is what slowed them: the step cores are the slowdown (this
    returned 1 there until 2026-12-05, and four of eighteen grid runs' colocated probes, whose pair left the serving
    path nothing per token, charged a prompt beside a decode one core where the pair's steps took 1.54-1.62)."""
    if steps + serving_cores < host_cores or slowdown <= (steps + serving_cores) / host_cores:
        return 1.0
    return (slowdown * host_cores - serving_cores) / steps


def fit_shared_demand(points: list[tuple[float, float]], host_cores: int, most_per_token_s: float,
                      steps: int = 2) -> tuple[float, float]:
    """(step_cores, serving_cpu_per_token_s) that make the simulator's shared cores slow `steps` steps in flight as
    measured at several loads: `points` are (the tokens per second the steps stream alone, their slowdown). The
    shared cores' demand is steps x step_cores + per_token x tokens/s = slowdown x host_cores, a line through the
    points (least squares). The per-token term lies within [0, most_per_token_s]: the serving path cannot take more
    from the engines than the CPU it spends per token (read from /proc), and less where it runs while the engine
    threads wait anyway (measured on the 2-core reference fleet: two colocated instances decoding 1, 2 and 4 each
    ran 1.41x, 1.46x and 1.53x their steps alone, where the serving path's CPU of 1.27 ms per token would make
    1.31x, 1.52x and 1.68x). step_cores at least 1, as fit_step_cores."""
    tokens = np.array([t for t, _ in points], dtype=float)
    demand = np.array([x for _, x in points], dtype=float) * host_cores
    per_token = float(np.polyfit(tokens, demand, 1)[0]) if len(points) > 1 and np.ptp(tokens) > 0 else most_per_token_s
    per_token = min(max(per_token, 0.0), most_per_token_s)
    return max(1.0, float(np.mean(demand - per_token * tokens)) / steps), per_token


def fit_prefill_weight(prefill_slowdown: float, decode_slowdown: float) -> float:
    """The prefill_weight (ServingOverhead) that splits the shared cores as measured with a prefill-only pass beside
    a decode batch: the simulator gives steps speeds in proportion to their weights (trtpd/sim/shared_cores.py), so
    the prefill's speed over the decode's, (1 / prefill_slowdown) / (1 / decode_slowdown); a decode not slowed
    counts as 1. At most 1: where the prefill lost no more than the decode, equal shares."""
    return min(1.0, max(1.0, decode_slowdown) / prefill_slowdown) if prefill_slowdown > 0 else 1.0


def _in_span(records: list[dict], span_s: tuple[float, float]) -> list[dict]:
    """The trace records whose time lies in span_s (start, end)."""
    return [r for r in records if span_s[0] <= r["t_s"] <= span_s[1]]


def _slowdown(periods: list[tuple[int, int, float]], alone_s: Callable[[int, int], float]) -> float:
    """The median decode period over alone_s(batch, context): how much slower than alone the steps ran."""
    return float(statistics.median(p / alone_s(b, c) for b, c, p in periods))


def fit_beside_prompt(prompt_slowdown: float, decode_slowdown: float, host_cores: int,
                      serving_cores: float) -> tuple[float, float, float]:
    """(prefill_weight, the two steps' slowdown together, the step cores) from a prompt's pass and the decode steps
    beside it, each slowed as measured, the serving path taking serving_cores: the weight splits the shared cores as
    measured (fit_prefill_weight), and the step cores make the demand that gives the two speeds together, as one
    slowdown each would (fit_step_cores)."""
    together = 2.0 / (1.0 / prompt_slowdown + 1.0 / max(1.0, decode_slowdown))
    return (fit_prefill_weight(prompt_slowdown, decode_slowdown), together,
            fit_step_cores(together, host_cores, serving_cores))


def _inside_and_apart(traces: list[tuple[list[dict], list[tuple[float, float]]]], batch: int
                      ) -> tuple[list[tuple[int, int, float]], list[tuple[int, int, float]]]:
    """For each (an engine's trace records, the other engine's passes): its decode periods at `batch` inside those
    passes, and those apart from them (the same phase's baseline)."""
    inside = [p for recs, spans in traces for p in step_trace.decode_periods(recs, within=spans) if p[0] == batch]
    apart = [p for recs, spans in traces for p in step_trace.decode_periods(recs, apart=spans) if p[0] == batch]
    return inside, apart


def _decode_beside_prefill(records: dict[str, list[dict]], span_s: tuple[float, float], batch: int,
                           alone_s: Callable[[int, int], float]) -> tuple[float, int]:
    """The decode steps' slowdown while the probe's long prompts were being prefilled, and how many steps: within
    `span_s` (start, end), the prefill engine's passes over LONG_PROMPT_TOKENS, the decode engine's turns at `batch`
    inside them against its turns at `batch` apart from them (each period over alone_s(batch, context), the
    medians' ratio). The baseline is the same phase's: the machine's speed moves between minutes (this machine's
    engine speed read x0.93-1.08 of the profile's minutes apart), and against the steps timed alone earlier in the
    probe the steps beside a prefill read x1.18-1.38 at a batch of 1 in three runs."""
    passes = [span for name, recs in records.items() if name.startswith("prefill-")
              for span in step_trace.prefill_passes(_in_span(recs, span_s), LONG_PROMPT_TOKENS)]
    inside, apart = _inside_and_apart([(_in_span(recs, span_s), passes) for name, recs in records.items()
                                       if name.startswith("decode-")], batch)
    if min(len(inside), len(apart)) < MIN_PERIODS:
        raise RuntimeError(f"serving probe: {len(inside)} decode steps at batch {batch} beside the {len(passes)} "
                           f"traced prefills of {LONG_PROMPT_TOKENS} tokens and {len(apart)} apart from them, "
                           f"{MIN_PERIODS} of each needed")
    return _slowdown(inside, alone_s) / _slowdown(apart, alone_s), len(inside)


def _stream_beside(url: str, prompts: list[str], work: Callable[[], Any],
                   output_tokens: int = CONTENTION_TOKENS) -> Any:
    """`work()` run while a decode batch of len(prompts) streams `output_tokens` tokens each; raises if the batch
    ended before the work did (the work would then not have run beside it)."""
    results: list = []
    streaming = threading.Thread(target=lambda: results.extend(run_stream(
        url, [BenchRequest(f"probe-beside-{i}", p, output_tokens, 0.0) for i, p in enumerate(prompts)])),
        daemon=True)
    streaming.start()
    time.sleep(CONTENTION_SETTLE_S)
    value = work()
    done_s = time.perf_counter()
    streaming.join()
    if len(results) != len(prompts) or any(r.error for r in results):
        raise RuntimeError(f"serving probe: the decode batch beside the prefills failed: "
                           f"{[r.error for r in results if r.error] or 'no results'}")
    if min(r.token_times_s[-1] for r in results) < done_s:
        raise RuntimeError(f"serving probe: the decode batch of {len(prompts)} x {output_tokens} tokens ended "
                           f"before the prefills beside it did; the machine is faster than this probe assumes")
    return value


def _colocated_pair(build_root: Path, prompts: list[str], long_prompt: str, trace_dir: Path
                    ) -> tuple[dict[str, list[dict]], dict[int, list[tuple[int, int, float]]], tuple[float, float]]:
    """Two colocated instances stepping together: a deployment of two, traced (Triton hands an instance group's
    requests out in turn, tests/e2e/test_instance_dispatch.py).
    - The decode periods by batch: for each of PAIR_BATCHES that many requests for each instance; only the steps at
      that batch (not the batch forming or draining).
    - Prompts beside the other instance's decode: 2 x LONG_PROMPT_ROUNDS prompts of LONG_PROMPT_TOKENS one after
      another on the idle pair (each alone in its pass: the baseline in the same minute), then as many while one
      request decodes BESIDE_PROMPTS_TOKENS tokens on one instance, every other one on the other instance (alone in
      its pass there) and every other one in a step with the decode; the (start, end) of both phases, for
      _prompts_beside_decode.
    Returns the trace (records by engine), the periods by batch and both phases' spans."""
    with step_trace.tracing(trace_dir):
        dep = deployment.up("probe-colocated-pair", ReferenceDeployment(build_root, mode="colocated",
                                                                        colocated_instances=2), replace=True)
    spans = {}
    try:
        url = dep.server.grpc_url
        run_stream(url, [BenchRequest(f"warmup-pair-{i}", p, 16, 0.0) for i, p in enumerate(prompts)])
        warm_every_instance(url, long_prompt, 2)
        for batch in PAIR_BATCHES:
            started = time.monotonic()
            # one after another, PAIR_SPACING_S apart: sent at once, Triton handed 8 out as 3 and 5 (measured here)
            results = run_stream(url, [
                BenchRequest(f"probe-pair-{batch}-{i}", p, CONTENTION_TOKENS, i * PAIR_SPACING_S)
                for i, p in enumerate((prompts * 2)[:2 * batch])])
            if any(r.error for r in results):
                raise RuntimeError(f"serving probe: a request of the colocated pair failed: "
                                   f"{next(r.error for r in results if r.error)}")
            spans[batch] = (started, time.monotonic())
        started = time.monotonic()
        _real_prefill_compute(url, long_prompt, 2 * LONG_PROMPT_ROUNDS)   # their passes are read from the trace
        lone_span = (started, time.monotonic())
        started = time.monotonic()
        _stream_beside(url, prompts[:1], lambda: _real_prefill_compute(url, long_prompt, 2 * LONG_PROMPT_ROUNDS),
                       BESIDE_PROMPTS_TOKENS)
        beside_span = (started, time.monotonic())
    finally:
        deployment.down(dep.name)
    traced = step_trace.read_trace(trace_dir)
    return traced, {batch: [p for records in traced.values()
                            for p in step_trace.decode_periods(_in_span(records, span)) if p[0] == batch]
                    for batch, span in spans.items()}, (lone_span, beside_span)


def _prompts_beside_decode(records: dict[str, list[dict]], spans_s: tuple[tuple[float, float], tuple[float, float]],
                           alone_s: Callable[[int, int], float]) -> tuple[float, float, int]:
    """In a colocated pair's trace, the two phases of _colocated_pair (`spans_s`: the lone prompts', then the
    prompts' beside a decode): each engine's passes over one prompt of LONG_PROMPT_TOKENS alone (no decode rows) in
    each phase, and the other engines' decode steps (one sequence) inside the second phase's passes against their
    steps apart from them. (The prompt's slowdown, its median pass beside the decode over its median pass on the
    idle pair; the decode steps' slowdown, the medians' ratio of their periods over alone_s(batch, context); how
    many steps inside.) Both baselines are the same minute's: the machine's speed moves between minutes, and the
    prompt against its lone passes earlier in the probe read x1.31-1.62 in four runs."""
    def passes(span_s: tuple[float, float]) -> dict[str, list[tuple[float, float]]]:
        return {name: step_trace.prefill_passes(_in_span(recs, span_s), LONG_PROMPT_TOKENS)
                for name, recs in records.items()}

    lone, beside = passes(spans_s[0]), passes(spans_s[1])
    inside, apart = _inside_and_apart([(_in_span(recs, spans_s[1]), [
        span for other, spans in beside.items() if other != name for span in spans]) for name, recs in records.items()],
        1)
    lone_s = [end - start for spans in lone.values() for start, end in spans]
    beside_s = [end - start for spans in beside.values() for start, end in spans]
    if not lone_s or not beside_s or min(len(inside), len(apart)) < MIN_PERIODS:
        raise RuntimeError(f"serving probe: {len(lone_s)} prompts of {LONG_PROMPT_TOKENS} tokens alone on the idle "
                           f"pair and {len(beside_s)} alone in their pass beside {len(inside)} decode steps of the "
                           f"other colocated instance ({len(apart)} apart from them): 1, 1, {MIN_PERIODS} and "
                           f"{MIN_PERIODS} needed")
    return (float(statistics.median(beside_s) / statistics.median(lone_s)),
            _slowdown(inside, alone_s) / _slowdown(apart, alone_s), len(inside))


def measure_serving_overhead(build_root: Path, hardware: HardwareProfile, mode: str, rounds: int = 3,
                             progress: Callable[[str], None] = lambda _: None) -> ServingOverhead:
    """`hardware` must carry the engine's measured curves (without serving overhead for this mode). One instance
    per role: the step costs are the engine process's own, measured where no second engine competes for the cores;
    then two engines stepping together (the disaggregated deployment's prefill beside its decode batch, or a second,
    colocated deployment of two instances) give what a step costs beside another (step_cores)."""
    tokenizer = load_checkpoint(build_root / "checkpoint").load_tokenizer()
    prompts = [prompt_with_tokens(tokenizer, PROMPT_TOKENS, seed=i) for i in range(BIG_BATCH)]
    long_prompt = prompt_with_tokens(tokenizer, LONG_PROMPT_TOKENS, seed=99)
    with tempfile.TemporaryDirectory(prefix="trtpd-steps-") as trace_dir, step_trace.tracing(Path(trace_dir) / "one"):
        dep = deployment.up(f"probe-{mode}", ReferenceDeployment(build_root, mode=mode, colocated_instances=1),
                            replace=True)
        try:
            url = dep.server.grpc_url
            # every stub and the batch-8 path warm before anything is timed (a cold first round inflated the costs)
            run_stream(url, [BenchRequest(f"warmup-{i}", p, 16, 0.0) for i, p in enumerate(prompts)])
            short_from = time.monotonic()
            ttft1, tpot1 = _real_samples(url, prompts[:1], LONE_ROUNDS, idle_before_s=LONE_IDLE_S)
            real1 = statistics.median(ttft1), statistics.median(tpot1)
            per_request_s = _per_request_cpu(url, prompts[0], serving_cpu_reader(dep, client=False))
            short_span = (short_from, time.monotonic())   # lone prompts of PROMPT_TOKENS, each alone in its pass
            warm_every_instance(url, long_prompt, 1)
            prefill_engine = build_root / f"{'prefill' if mode == 'disaggregated' else mode}-tp1"
            lone_from = time.monotonic()
            side_by_side = {n: _prefill_side_by_side(
                url, long_prompt if n == LONG_PROMPT_TOKENS else prompt_with_tokens(tokenizer, n, seed=99), n,
                prefill_engine, LONE_ROUNDS) for n in PASS_PROMPT_TOKENS}
            lone_span = (lone_from, time.monotonic())
            ttft_long = side_by_side[LONG_PROMPT_TOKENS][1]   # the long prompt's TTFTs (the response latency)
            for batch in STEP_BATCHES:   # decode steps at more batch sizes for the step costs' line
                _real(url, prompts[:batch], 1)
            serving_cpu = serving_cpu_reader(dep)
            cpu_before_s = serving_cpu()
            real8 = _real(url, prompts, rounds)
            batch8_cpu_s = serving_cpu() - cpu_before_s
            alone_until = time.monotonic()
            if mode == "disaggregated":
                # the prefill alone just before the batch streams: its baseline in the same minute
                lone_s = _real_prefill_compute(url, long_prompt, LONG_PROMPT_ROUNDS)
                started = time.monotonic()
                prefill_slowdown = _stream_beside(url, prompts[:CONTENTION_BATCH], lambda: _real_prefill_compute(
                    url, long_prompt, LONG_PROMPT_ROUNDS)) / lone_s
                beside_span = (started, time.monotonic())
        finally:
            deployment.down(dep.name)
        traced = step_trace.read_trace(Path(trace_dir) / "one")
        # per token: the batch of 8's CPU outside the engines, less its requests' own (the simulator runs those as
        # jobs from their arrivals)
        cpu_per_token_s = max(0.0, batch8_cpu_s - BIG_BATCH * rounds * per_request_s) / (
            BIG_BATCH * OUTPUT_TOKENS * rounds)
        alone = [p for records in traced.values()
                 for p in step_trace.decode_periods([r for r in records if r["t_s"] <= alone_until])]
        if mode == "colocated":
            pair_traced, pair, pair_spans = _colocated_pair(build_root, prompts, long_prompt,
                                                             Path(trace_dir) / "pair")
    served_passes = {n: [end - start for records in traced.values()
                         for start, end in step_trace.prefill_passes(_in_span(records, lone_span), n)]
                     for n in PASS_PROMPT_TOKENS}
    if not all(served_passes.values()):
        raise RuntimeError(f"serving probe: no lone prefill pass in the trace for prompts of "
                           f"{[n for n, v in served_passes.items() if not v]} tokens")
    pass_points = [(side_by_side[n][0], float(statistics.median(served_passes[n]))) for n in PASS_PROMPT_TOKENS]
    prefill_scale, prefill_pass_s = fit_prefill_pass(pass_points)
    model = get_model(load_checkpoint(build_root / "checkpoint").spec.name)
    opts = options_from_engines(build_root, ClusterOptions(num_colocated=1, first_token_at="decode"))
    curves = instance_perf(model, hardware, 1, opts.weight_dtype, opts.kv_dtype).perf   # the curves alone
    step_s, per_sequence_s = fit_step_costs(alone, curves)
    profiled_s = curves.prefill_s(LONG_PROMPT_TOKENS, LONG_PROMPT_TOKENS ** 2)
    host_cores = len(os.sched_getaffinity(0))

    def alone_s(batch: int, context: int) -> float:   # a decode step alone, as the simulator charges it
        return curves.decode_step_s(batch, context) + step_s + batch * per_sequence_s

    # the serving path's cores while decode batches stream beside: their tokens per second alone, as the simulator
    # counts them
    prefill_weight, prefill_step_cores = 1.0, None
    if mode == "disaggregated":
        batch_s = alone_s(CONTENTION_BATCH, CONTENTION_BATCH * (PROMPT_TOKENS + CONTENTION_TOKENS // 2))
        serving_cores = cpu_per_token_s * CONTENTION_BATCH / batch_s
        decode_slowdown, num_beside = _decode_beside_prefill(traced, beside_span, CONTENTION_BATCH, alone_s)
        prefill_weight, slowdown, step_cores = fit_beside_prompt(prefill_slowdown, decode_slowdown, host_cores,
                                                                 serving_cores)
        beside = (f"a {LONG_PROMPT_TOKENS}-token prefill beside a decode batch of {CONTENTION_BATCH}: the prefill "
                  f"x{prefill_slowdown:.2f} its time alone, the decode steps x{decode_slowdown:.2f} ({num_beside} "
                  f"steps) -> prefill weight {prefill_weight:.2f}; together")
        per_token_s = cpu_per_token_s
    else:
        points = []
        for batch, periods in pair.items():
            if len(periods) < MIN_PERIODS:
                raise RuntimeError(f"serving probe: {len(periods)} decode steps at batch {batch} of the colocated "
                                   f"pair in the trace, {MIN_PERIODS} needed")
            points.append((2 * float(statistics.mean(b / alone_s(b, c) for b, c, _ in periods)),
                           _slowdown(periods, alone_s)))
        step_cores, per_token_s = fit_shared_demand(points, host_cores, cpu_per_token_s)
        slowdown = points[-1][1]
        serving_cores = per_token_s * points[-1][0]
        # a prompt alone in its pass on one instance beside the other's decode: its pass against the same prompt's
        # on the idle pair just before, the decode steps against their own apart from the prompts' passes
        prompt_slowdown, decode_slowdown, num_beside = _prompts_beside_decode(pair_traced, pair_spans, alone_s)
        decode_tokens_per_s = 1.0 / alone_s(1, PROMPT_TOKENS + BESIDE_PROMPTS_TOKENS // 2)
        prefill_weight, _, prefill_step_cores = fit_beside_prompt(prompt_slowdown, decode_slowdown, host_cores,
                                                                  per_token_s * decode_tokens_per_s)
        beside = (f"two colocated instances decoding {', '.join(map(str, pair))} each: "
                  + ", ".join(f"x{x:.2f} at {t:.0f} tokens/s" for t, x in points)
                  + f" -> the serving path takes {per_token_s * 1e3:.2f} ms of the cores per token (of the "
                  f"{cpu_per_token_s * 1e3:.2f} it spends); a {LONG_PROMPT_TOKENS}-token prompt on one beside a "
                  f"decode of 1 on the other: the prompt x{prompt_slowdown:.2f} its pass alone, the decode steps "
                  f"x{decode_slowdown:.2f} ({num_beside} steps) -> prefill weight {prefill_weight:.2f}, "
                  f"{prefill_step_cores:.2f} cores per step beside a prompt; at {CONTENTION_BATCH} each")
    overhead = ServingOverhead(host_cores=host_cores, serving_cpu_per_token_s=per_token_s,
                               step_overhead_s=step_s, per_sequence_step_s=per_sequence_s, step_cores=step_cores,
                               prefill_weight=prefill_weight, prefill_step_cores=prefill_step_cores,
                               prefill_compute_scale=prefill_scale, prefill_pass_s=prefill_pass_s,
                               serving_cpu_per_request_s=per_request_s)
    make = disaggregated_cluster if mode == "disaggregated" else colocated_cluster
    # the measured costs without any response latency: what the real TTFTs are held against
    cluster = replace(make(model, _with_serving(hardware, mode, overhead), opts), response_latency_s=0.0)
    sim1, sim8 = _simulated(cluster, 1), _simulated(cluster, BIG_BATCH)
    sim_long = _simulated(cluster, 1, LONG_PROMPT_TOKENS, 1)[0]
    # the lone prompts' passes in the server as traced, beyond the simulated pass (fit_response_latency)
    served = (cluster.prefill or cluster.decode).perf   # the entry role's perf model, the serving terms in it
    traced_pass_s = {PROMPT_TOKENS: float(statistics.median(
        [end - start for records in traced.values()
         for start, end in step_trace.prefill_passes(_in_span(records, short_span), PROMPT_TOKENS)] or [math.nan])),
        LONG_PROMPT_TOKENS: float(statistics.median(served_passes[LONG_PROMPT_TOKENS]))}
    pass_beyond_s = {n: 0.0 if math.isnan(x) else x - served.prefill_s(n, n * n) for n, x in traced_pass_s.items()}
    response_s = fit_response_latency([(t, sim1[0], pass_beyond_s[PROMPT_TOKENS]) for t in ttft1] +
                                      [(t, sim_long, pass_beyond_s[LONG_PROMPT_TOKENS]) for t in ttft_long])
    overhead = overhead.model_copy(update={"response_latency_s": response_s})
    progress(f"serving ({mode}): decode steps in the server {step_s * 1e3:+.2f} ms + {per_sequence_s * 1e3:.2f} ms per "
             f"sequence beyond the profile's pass ({len(alone)} steps at batches "
             f"{', '.join(map(str, sorted({p[0] for p in alone})))}), so TPOT at 1/{BIG_BATCH} real "
             f"{real1[1] * 1e3:.2f}/{real8[1] * 1e3:.2f} vs simulated {sim1[1] * 1e3:.2f}/{sim8[1] * 1e3:.2f} ms; "
             f"lone requests' TTFT beyond the simulated: {PROMPT_TOKENS} tokens +"
             f"{(real1[0] - sim1[0]) * 1e3:.1f} ms ({real1[0] * 1e3:.1f} real, median of {len(ttft1)}), "
             f"{LONG_PROMPT_TOKENS} tokens +{(statistics.median(ttft_long) - sim_long) * 1e3:.1f} ms (of "
             f"{len(ttft_long)}), their passes in the server {pass_beyond_s[PROMPT_TOKENS] * 1e3:+.1f} / "
             f"{pass_beyond_s[LONG_PROMPT_TOKENS] * 1e3:+.1f} ms beyond the simulated -> response "
             f"+{overhead.response_latency_s * 1e3:.1f} ms; the serving path's CPU "
             f"{cpu_per_token_s * 1e3:.2f} ms per token and {per_request_s * 1e3:.1f} ms per request (lone requests of "
             f"{PER_REQUEST_TOKENS} tokens) on {host_cores} shared cores; a prompt of "
             f"{'/'.join(map(str, PASS_PROMPT_TOKENS))} tokens alone: the prefill pass "
             f"{' / '.join(f'{y * 1e3:.1f}' for _, y in pass_points)} ms in the server, "
             f"{' / '.join(f'{x * 1e3:.1f}' for x, _ in pass_points)} in this process in turns with it (the "
             f"profile's {profiled_s * 1e3:.1f} at {LONG_PROMPT_TOKENS}) -> x{prefill_scale:.2f} + "
             f"{prefill_pass_s * 1e3:.1f} ms a pass; {beside}: x{slowdown:.2f} its time alone (one core per step "
             f"and the serving path's {serving_cores:.2f} cores make "
             f"x{max(1.0, (2 + serving_cores) / host_cores):.2f}) -> {step_cores:.2f} cores per step")
    return overhead
