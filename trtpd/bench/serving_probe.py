"""Measure what serving adds to the engine's forward passes, through the real tritonserver.

A small, unloaded probe: batches of 1 and 8 identical-length requests sent at once, streamed over
gRPC; the same scenario is simulated with the measured forward-pass curves alone, and the gaps give
the serving overhead: a response latency (request path: pre/post-processing, orchestrator, hops),
and a decode-step cost per step and per sequence (the response pipeline's IPC and CPU).
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
from trtpd.repo.reference import ReferenceDeployment
from trtpd.serving import deployment
from trtpd.sim.build import ClusterOptions, colocated_cluster, disaggregated_cluster, options_from_engines
from trtpd.sim.metrics import latencies
from trtpd.sim.simulator import simulate
from trtpd.sim.workload import RequestArrays

PROMPT_TOKENS, OUTPUT_TOKENS, BIG_BATCH = 100, 64, 8


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


def _simulated(cluster, batch: int) -> tuple[float, float]:
    arrays = RequestArrays([0.0] * batch, [PROMPT_TOKENS] * batch, [OUTPUT_TOKENS] * batch)
    lat = latencies(simulate(cluster, arrays), warmup_fraction=0.0)
    return statistics.median(lat.ttft_s), statistics.median(lat.tpot_s)


def measure_serving_overhead(build_root: Path, hardware: HardwareProfile, mode: str, colocated_instances: int = 2,
                             rounds: int = 3, progress: Callable[[str], None] = lambda _: None) -> ServingOverhead:
    """`hardware` must carry the engine's measured curves (without serving overhead for this mode)."""
    tokenizer = load_checkpoint(build_root / "checkpoint").load_tokenizer()
    prompts = [prompt_with_tokens(tokenizer, PROMPT_TOKENS, seed=i) for i in range(BIG_BATCH)]
    dep = deployment.up(f"probe-{mode}", ReferenceDeployment(build_root, mode=mode,
                                                             colocated_instances=colocated_instances), replace=True)
    try:
        run_stream(dep.server.grpc_url, [BenchRequest("warmup", prompts[0], 8, 0.0)])
        real1 = _real(dep.server.grpc_url, prompts[:1], rounds)
        real8 = _real(dep.server.grpc_url, prompts, rounds)
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
    progress(f"serving ({mode}): TTFT real {real1[0] * 1e3:.1f} vs engine {sim1[0] * 1e3:.1f} ms; TPOT at 1/{BIG_BATCH} "
             f"real {real1[1] * 1e3:.2f}/{real8[1] * 1e3:.2f} vs engine {sim1[1] * 1e3:.2f}/{sim8[1] * 1e3:.2f} ms -> "
             f"response +{overhead.response_latency_s * 1e3:.1f} ms, step +{overhead.step_overhead_s * 1e3:.2f} ms "
             f"+ {overhead.per_sequence_step_s * 1e3:.2f} ms per sequence")
    return overhead
