"""Simulator speed: simulated requests per wall-clock second (goal, issue 10: above 30,000 on every scenario).

Scenarios are planned clusters (what `trtpd plan` verifies) and the plan's colocated configuration on its
GPUs, simulated with the fast path: the shared PrefillScheduler and ContinuousBatchScheduler make every
decision. Run:
    .venv/bin/python benchmarks/sim_speed.py [--num-requests 50000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

from trtpd.catalog import get_model
from trtpd.perf.hardware import load_hardware
from trtpd.planner.inputs import SearchSpace, Target, load_slo
from trtpd.planner.make import VerifyOptions, make_plan
from trtpd.planner.search import PlanProblem
from trtpd.sim.build import colocated_cluster, disaggregated_cluster, options_from_plan
from trtpd.sim.metrics import summarize
from trtpd.sim.simulator import simulate
from trtpd.sim.workload import generate_requests, load_workload

SCENARIOS = (
    # (label, hardware, workload, slo, target)
    ("chat 40 req/s, llama-2-70b, h100", "h100-sxm", "chat-powerlaw", "chat", Target(rate_per_s=40)),
    ("chat 200 req/s, llama-2-70b, h100", "h100-sxm", "chat-powerlaw", "chat", Target(rate_per_s=200)),
    ("seed004 5M tok/min, llama-2-70b, h200", "h200", "seed004", "seed004", Target(tokens_per_min=5e6)),
)


def bench(label: str, cluster, requests, repeats: int, slo) -> None:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run = simulate(cluster, requests)
        times.append(time.perf_counter() - t0)
    best, median = min(times), statistics.median(times)
    attainment = summarize(run, slo.ttft_s, slo.tpot_s).slo_attainment
    print(f"  {label:<58} {len(requests) / best:>7,.0f} requests/s (median {len(requests) / median:,.0f}; "
          f"{best:.2f} s for {len(requests):,}; {run.num_events / best:,.0f} events/s; "
          f"{cluster.colocated_policy + ' policy; ' if cluster.mode == 'colocated' else ''}"
          f"SLO attainment {attainment:.0%})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--num-requests", type=int, default=50_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    model = get_model("llama-2-70b")
    print(f"simulated requests per second (best of {args.repeats}, and the median):")
    for label, hw_name, wl_name, slo_name, target in SCENARIOS:
        hw, wl = load_hardware(hw_name), load_workload(wl_name)
        plan = make_plan(PlanProblem(model, hw, wl, load_slo(slo_name), target, SearchSpace()),
                         VerifyOptions(num_requests=3000))
        opts = options_from_plan(plan)
        requests = generate_requests(wl, plan.target.rate_per_s, args.num_requests, seed=1)
        shape = f"{plan.prefill.num_instances}P{plan.decode.num_instances}D"
        slo = load_slo(slo_name)
        bench(f"{label}: disaggregated {shape}", disaggregated_cluster(model, hw, opts), requests, args.repeats, slo)
        num = max(1, opts.num_gpus // opts.tp_decode)
        bench(f"{label}: colocated {num} x TP{opts.tp_decode}", colocated_cluster(model, hw, opts), requests,
              args.repeats, slo)


if __name__ == "__main__":
    main()
