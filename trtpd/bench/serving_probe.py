"""Measure what serving adds to the engine's forward passes, through the real tritonserver.

A small probe: batches of 1 and 8 identical-length requests sent at once, streamed over gRPC; the
same scenario is simulated with the measured forward-pass curves alone, and the gaps give the serving
overhead: a response latency (request path: pre/post-processing, orchestrator, hops), and a
decode-step cost per step and per sequence (the response pipeline's IPC and CPU). Disaggregated,
a third run keeps prefill busy with long prompts while the batch of 8 decodes: on shared cores
decode steps slow down then (`decode_contention`; on GPUs the roles do not share compute).
The validation workload (`benchmarks/validate_sim.py`) is a different, loaded scenario.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from trtpd.bench.client import BenchRequest, run_stream
from trtpd.bench.prompts import prompt_with_tokens
from trtpd.catalog import get_model
from trtpd.engine.checkpoint import load_checkpoint
from trtpd.perf.hardware import HardwareProfile
from trtpd.perf.measured import ServingOverhead
from trtpd.deploy.spec import ReferenceDeployment
from trtpd.fleet import deployment
from trtpd.sim.cluster_specs import ClusterOptions, colocated_cluster, disaggregated_cluster, options_from_engines
from trtpd.sim.metrics import latencies
from trtpd.sim.simulator import simulate
from trtpd.sim.workload import RequestArrays

PROMPT_TOKENS, OUTPUT_TOKENS, BIG_BATCH = 100, 64, 8
HOG_PROMPT_TOKENS, NUM_HOGS, HOG_DELAY_S = 1500, 3, 0.08   # long prompts that keep prefill busy while decode runs


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


def _simulated(cluster, batch: int, hogs: int = 0) -> tuple[float, float]:
    arrays = RequestArrays([0.0] * batch + [HOG_DELAY_S] * hogs, [PROMPT_TOKENS] * batch + [HOG_PROMPT_TOKENS] * hogs,
                           [OUTPUT_TOKENS] * batch + [1] * hogs)
    lat = latencies(simulate(cluster, arrays), warmup_fraction=0.0)
    return statistics.median(lat.ttft_s[:batch]), statistics.median(lat.tpot_s[:batch])


def _real_under_prefill_load(url: str, prompts: list[str], hog: str, rounds: int) -> float:
    """Median TPOT of a decode batch while long prompts keep the prefill instance busy."""
    tpot = []
    for r in range(rounds):
        reqs = [BenchRequest(f"busy-{r}-{i}", p, OUTPUT_TOKENS, 0.0) for i, p in enumerate(prompts)]
        reqs += [BenchRequest(f"hog-{r}-{i}", hog, 1, HOG_DELAY_S) for i in range(NUM_HOGS)]
        results = run_stream(url, reqs)
        if any(res.error for res in results):
            raise RuntimeError(f"serving probe request failed: {next(res.error for res in results if res.error)}")
        tpot += [res.tpot_s for res in results[:len(prompts)]]
    return statistics.median(tpot)


def measure_serving_overhead(build_root: Path, hardware: HardwareProfile, mode: str, colocated_instances: int = 2,
                             rounds: int = 3, progress: Callable[[str], None] = lambda _: None) -> ServingOverhead:
    """`hardware` must carry the engine's measured curves (without serving overhead for this mode)."""
    tokenizer = load_checkpoint(build_root / "checkpoint").load_tokenizer()
    prompts = [prompt_with_tokens(tokenizer, PROMPT_TOKENS, seed=i) for i in range(BIG_BATCH)]
    hog = prompt_with_tokens(tokenizer, HOG_PROMPT_TOKENS, seed=1000)
    dep = deployment.up(f"probe-{mode}", ReferenceDeployment(build_root, mode=mode,
                                                             colocated_instances=colocated_instances), replace=True)
    try:
        run_stream(dep.server.grpc_url, [BenchRequest("warmup", prompts[0], 8, 0.0)])
        real1 = _real(dep.server.grpc_url, prompts[:1], rounds)
        real8 = _real(dep.server.grpc_url, prompts, rounds)
        busy8 = _real_under_prefill_load(dep.server.grpc_url, prompts, hog, rounds) if mode == "disaggregated" else None
    finally:
        deployment.down(dep.name)
    model = get_model(load_checkpoint(build_root / "checkpoint").spec.name)
    opts = options_from_engines(build_root, ClusterOptions(num_colocated=colocated_instances, first_token_at="decode"))
    make = disaggregated_cluster if mode == "disaggregated" else colocated_cluster
    cluster = replace(make(model, hardware, opts), response_latency_s=0.0)
    sim1, sim8 = _simulated(cluster, 1), _simulated(cluster, BIG_BATCH)
    gap1, gap8 = real1[1] - sim1[1], real8[1] - sim8[1]
    per_sequence = max(0.0, (gap8 - gap1) / (BIG_BATCH - 1))
    overhead = ServingOverhead(response_latency_s=max(0.0, real1[0] - sim1[0]),
                               step_overhead_s=max(0.0, gap1 - per_sequence), per_sequence_step_s=per_sequence)
    if busy8 is not None:   # shared cores: how much slower decode steps run while prefill computes
        with_overhead = replace(make(model, hardware.model_copy(update={"measured": [
            m.model_copy(update={"serving": {**m.serving, mode: overhead}}) for m in hardware.measured]}), opts),
            response_latency_s=0.0)
        busy_sim = _simulated(with_overhead, BIG_BATCH, NUM_HOGS)[1]
        overhead = overhead.model_copy(update={"decode_contention": max(0.0, busy8 / busy_sim - 1.0)})
    progress(f"serving ({mode}): TTFT real {real1[0] * 1e3:.1f} vs engine {sim1[0] * 1e3:.1f} ms; TPOT at 1/{BIG_BATCH} "
             f"real {real1[1] * 1e3:.2f}/{real8[1] * 1e3:.2f} vs engine {sim1[1] * 1e3:.2f}/{sim8[1] * 1e3:.2f} ms -> "
             f"response +{overhead.response_latency_s * 1e3:.1f} ms, step +{overhead.step_overhead_s * 1e3:.2f} ms "
             f"+ {overhead.per_sequence_step_s * 1e3:.2f} ms per sequence"
             + (f"; decode TPOT while prefill computes {busy8 * 1e3:.2f} ms -> contention "
                f"+{overhead.decode_contention:.0%}" if busy8 is not None else ""))
    return overhead
