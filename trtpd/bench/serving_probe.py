"""Measure what serving adds to the engine's forward passes, through the real tritonserver.

A small probe: batches of 1 and 8 identical-length requests sent at once, streamed over gRPC; the
same scenario is simulated with the measured forward-pass curves alone, and the gaps give the serving
overhead: a response latency (request path: pre/post-processing, orchestrator, hops), and a
decode-step cost per step and per sequence (the response pipeline's work in the engine's own process).
While the batch of 8 runs, the CPU the rest of the deployment and the client spend (every process of the
server's group but the engines' stubs, and this process, which is the client then) is read from /proc: per
streamed token, it is the serving path's share of the host's cores, which the simulator's shared cores take from
the engines when the host is oversubscribed (`host_cores`, `serving_cpu_per_token_s`; trtpd/sim/shared_cores.py).
The validation workload (`benchmarks/validate_sim.py`) is a different, loaded scenario.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from trtpd.bench.client import BenchRequest, run_stream
from trtpd.bench.proc_cpu import cpu_s, group_pids
from trtpd.bench.prompts import prompt_with_tokens
from trtpd.catalog import get_model
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
LONG_PROMPT_ROUNDS = 5     # its median
ENGINE_MODELS = ("prefill", "decode", "colocated")   # the role models whose stubs run the engines (repo/reference.py)
CALIBRATION_ROUNDS = 4


def _real(url: str, prompts: list[str], rounds: int) -> tuple[float, float]:
    """Median TTFT and TPOT over `rounds` rounds of len(prompts) requests sent at once."""
    ttft, tpot = [], []
    for r in range(rounds):
        reqs = [BenchRequest(f"probe-{len(prompts)}-{r}-{i}", p, OUTPUT_TOKENS, 0.0) for i, p in enumerate(prompts)]
        for res in run_stream(url, reqs):
            if res.error:
                raise RuntimeError(f"serving probe request failed: {res.error}")
            ttft.append(res.ttft_s)
            tpot.append(res.tpot_s)
    return statistics.median(ttft), statistics.median(tpot)


def _real_prefill_compute(url: str, prompt: str, rounds: int) -> float:
    """Median prefill compute the engine reports (its perf output, PERF_OUTPUTS) for one prompt at a time: each
    request alone in its batch, so that the pass is the one the profile timed."""
    compute = []
    for r in range(rounds):
        (res,) = run_stream(url, [BenchRequest(f"probe-long-{r}", prompt, 1, 0.0)])
        if res.error:
            raise RuntimeError(f"serving probe request failed: {res.error}")
        if "prefill_compute_ms" not in res.perf:
            raise RuntimeError("serving probe: the response carries no prefill_compute_ms perf output")
        compute.append(res.perf["prefill_compute_ms"] / 1e3)
    return statistics.median(compute)


def warm_every_instance(url: str, prompt: str, num_instances: int, max_tokens: int = 1) -> None:
    """An engine's first pass over a prompt longer than any it has run is slower (measured on a colocated
    instance: 231 ms for 512 tokens, then 97-133 ms): `prompt` runs once on each of the entry role's
    `num_instances` before anything is timed. Triton hands an instance group's requests to its instances in turn
    (tests/e2e/test_instance_dispatch.py), so one request each reaches them all."""
    for i in range(num_instances):
        (res,) = run_stream(url, [BenchRequest(f"warmup-long-{i}", prompt, max_tokens, 0.0)])
        if res.error:
            raise RuntimeError(f"warm-up request failed: {res.error}")


def _simulated(cluster, batch: int) -> tuple[float, float]:
    arrays = RequestArrays([0.0] * batch, [PROMPT_TOKENS] * batch, [OUTPUT_TOKENS] * batch)
    lat = latencies(simulate(cluster, arrays), warmup_fraction=0.0)
    return statistics.median(lat.ttft_s), statistics.median(lat.tpot_s)


def fit_step_costs(real_tpot_s: tuple[float, float], simulated_tpot_s: Callable[[ServingOverhead], tuple],
                   overhead: ServingOverhead, rounds: int = CALIBRATION_ROUNDS) -> ServingOverhead:
    """The step costs (step_overhead_s, per_sequence_step_s) that make the simulated TPOTs at batch 1 and at
    BIG_BATCH those measured, with everything else in `overhead` (the shared cores) as it is: the gaps left are
    put into the two costs, round after round (the sharing they cause moves with them)."""
    for _ in range(rounds):
        sim1, sim8 = simulated_tpot_s(overhead)
        gap1, gap8 = real_tpot_s[0] - sim1, real_tpot_s[1] - sim8
        per_sequence = max(0.0, overhead.per_sequence_step_s + (gap8 - gap1) / (BIG_BATCH - 1))
        # the intercept may be negative: the server's step at batch 1 shorter than the profile's (measured here:
        # 3.63 ms against 3.77); held at 0 it made the per-sequence cost carry batch 8's gap alone and put every
        # small batch's step 20-25% long
        step = max(-0.5 * sim1, overhead.step_overhead_s + gap1 - (per_sequence - overhead.per_sequence_step_s))
        overhead = overhead.model_copy(update={"step_overhead_s": step, "per_sequence_step_s": per_sequence})
    return overhead


def fit_prefill_scale(real_compute_s: float, profiled_s: float) -> float:
    """How much longer the engine's prefill pass takes in the server than in the profile: the prefill compute the
    engine reported for a prompt alone in its batch over the profile's figure for that prompt. (Not from the
    batch of 8: the serving path hands those to the engine one by one, so the engine's batches are not the ones
    the profile would predict, and their means would mix the batching into the scale.)"""
    if profiled_s <= 0:
        raise ValueError(f"the profile's prefill is {profiled_s} s: its prefill curve is empty")
    return real_compute_s / profiled_s


def _with_serving(hardware: HardwareProfile, mode: str, overhead: ServingOverhead) -> HardwareProfile:
    return hardware.model_copy(update={"measured": [m.model_copy(update={"serving": {**m.serving, mode: overhead}})
                                                    for m in hardware.measured]})


def _serving_cpu(dep: deployment.Deployment) -> Callable[[], float]:
    """A reading of the CPU seconds spent so far outside the engines: the server's group but the engine stubs
    (tritonserver, the orchestrator and pre/post-processing stubs), and this process (the client)."""
    engines = {e.pid for e in stub_watch.read_registry(dep.folder) if e.model in ENGINE_MODELS}
    if not engines:
        raise RuntimeError(f"serving probe: no engine stub of {', '.join(ENGINE_MODELS)} in {dep.folder}/stubs")
    others = [pid for pid in group_pids([dep.server.pid]) if pid not in engines]
    return lambda: cpu_s(others) + time.process_time()


def measure_serving_overhead(build_root: Path, hardware: HardwareProfile, mode: str, colocated_instances: int = 2,
                             rounds: int = 3, progress: Callable[[str], None] = lambda _: None) -> ServingOverhead:
    """`hardware` must carry the engine's measured curves (without serving overhead for this mode)."""
    tokenizer = load_checkpoint(build_root / "checkpoint").load_tokenizer()
    prompts = [prompt_with_tokens(tokenizer, PROMPT_TOKENS, seed=i) for i in range(BIG_BATCH)]
    dep = deployment.up(f"probe-{mode}", ReferenceDeployment(build_root, mode=mode,
                                                             colocated_instances=colocated_instances), replace=True)
    try:
        # every stub and the batch-8 path warm before anything is timed (a cold first round inflated the step costs)
        run_stream(dep.server.grpc_url, [BenchRequest(f"warmup-{i}", p, 16, 0.0) for i, p in enumerate(prompts)])
        real1 = _real(dep.server.grpc_url, prompts[:1], rounds)
        long_prompt = prompt_with_tokens(tokenizer, LONG_PROMPT_TOKENS, seed=99)
        warm_every_instance(dep.server.grpc_url, long_prompt, colocated_instances if mode == "colocated" else 1)
        real_prefill_s = _real_prefill_compute(dep.server.grpc_url, long_prompt, LONG_PROMPT_ROUNDS)
        serving_cpu = _serving_cpu(dep)
        cpu_before_s = serving_cpu()
        real8 = _real(dep.server.grpc_url, prompts, rounds)
        cpu_per_token_s = (serving_cpu() - cpu_before_s) / (BIG_BATCH * OUTPUT_TOKENS * rounds)
    finally:
        deployment.down(dep.name)
    model = get_model(load_checkpoint(build_root / "checkpoint").spec.name)
    opts = options_from_engines(build_root, ClusterOptions(num_colocated=colocated_instances, first_token_at="decode"))
    make = disaggregated_cluster if mode == "disaggregated" else colocated_cluster
    # The step costs are what the real TPOTs have beyond the simulated ones, the serving path's share of the cores
    # included: at batch 8 the host may be oversubscribed, and the simulator's shared cores slow the steps by that
    # already (counting it in per_sequence_step_s too would count it twice). Their effect on the sharing makes the
    # fit a fixed point: a few rounds of correcting both costs by the gaps left.
    def simulated(overhead: ServingOverhead) -> tuple[tuple[float, float], tuple[float, float]]:
        cluster = replace(make(model, _with_serving(hardware, mode, overhead), opts), response_latency_s=0.0)
        return _simulated(cluster, 1), _simulated(cluster, BIG_BATCH)

    start = ServingOverhead(host_cores=len(os.sched_getaffinity(0)), serving_cpu_per_token_s=cpu_per_token_s)
    engine1, engine8 = simulated(start)        # the engine alone: no step costs yet
    profiled_s = instance_perf(model, hardware, 1, opts.weight_dtype, opts.kv_dtype).perf.prefill_s(   # the curves alone
        LONG_PROMPT_TOKENS, LONG_PROMPT_TOKENS ** 2)
    start = start.model_copy(update={"prefill_compute_scale": fit_prefill_scale(real_prefill_s, profiled_s)})
    overhead = fit_step_costs((real1[1], real8[1]), lambda o: tuple(s[1] for s in simulated(o)), start)
    sim1 = simulated(overhead)[0]
    overhead = overhead.model_copy(update={"response_latency_s": max(0.0, real1[0] - sim1[0])})
    progress(f"serving ({mode}): TTFT real {real1[0] * 1e3:.1f} vs simulated {sim1[0] * 1e3:.1f} ms; TPOT at 1/{BIG_BATCH} "
             f"real {real1[1] * 1e3:.2f}/{real8[1] * 1e3:.2f} vs engine {engine1[1] * 1e3:.2f}/{engine8[1] * 1e3:.2f} ms -> "
             f"response +{overhead.response_latency_s * 1e3:.1f} ms, step {overhead.step_overhead_s * 1e3:+.2f} ms "
             f"+ {overhead.per_sequence_step_s * 1e3:.2f} ms per sequence; the serving path's CPU "
             f"{cpu_per_token_s * 1e3:.2f} ms per token on {overhead.host_cores} shared cores; one prompt of "
             f"{LONG_PROMPT_TOKENS} tokens: prefill {real_prefill_s * 1e3:.1f} ms in the server, {profiled_s * 1e3:.1f} "
             f"profiled -> x{overhead.prefill_compute_scale:.2f}")
    return overhead
