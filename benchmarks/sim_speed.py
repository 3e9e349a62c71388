"""Simulator speed: simulated requests per wall-clock second (goal, issue 10: above 30,000 on every scenario).

Scenarios are planned clusters (what `trtpd plan` verifies) and the plan's colocated configuration on its
GPUs, simulated with the fast path: the shared PrefillScheduler and ContinuousBatchScheduler make every
decision. Run:
    .venv/bin/python benchmarks/sim_speed.py [--num-requests 50000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from trtpd.catalog import get_model
from trtpd.perf.hardware import load_hardware
from trtpd.planner.inputs import SearchSpace, Target, load_slo
from trtpd.planner.make import VerifyOptions, make_plan
from trtpd.planner.search import PlanProblem
from trtpd.sim.cluster_specs import colocated_cluster, disaggregated_cluster, options_from_plan
from trtpd.sim.metrics import summarize
from trtpd.sim.simulator import simulate
from trtpd.sim.workload import generate_requests, load_workload

SCENARIOS = (
    # (label, hardware, workload, slo, target)
    ("chat 40 req/s, llama-2-70b, h100", "h100-sxm", "chat-powerlaw", "chat", Target(rate_per_s=40)),
    ("chat 200 req/s, llama-2-70b, h100", "h100-sxm", "chat-powerlaw", "chat", Target(rate_per_s=200)),
    ("seed004 5M tok/min, llama-2-70b, h200", "h200", "seed004", "seed004", Target(tokens_per_min=5e6)),
)


def bench(label: str, cluster, requests, repeats: int, slo) -> dict:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run = simulate(cluster, requests)
        times.append(time.perf_counter() - t0)
    attainment = summarize(run, slo.ttft_s, slo.tpot_s).slo_attainment
    return {"label": label, "times": times, "num_requests": len(requests), "num_events": run.num_events,
            "policy": cluster.colocated_policy if cluster.mode == "colocated" else None, "attainment": attainment}


def scenario(index: int, num_requests: int, repeats: int) -> list[dict]:
    label, hw_name, wl_name, slo_name, target = SCENARIOS[index]
    model, hw, wl = get_model("llama-2-70b"), load_hardware(hw_name), load_workload(wl_name)
    plan = make_plan(PlanProblem(model, hw, wl, load_slo(slo_name), target, SearchSpace()),
                     VerifyOptions(num_requests=3000))
    opts = options_from_plan(plan)
    requests = generate_requests(wl, plan.target.rate_per_s, num_requests, seed=1)
    shape = f"{plan.prefill.num_instances}P{plan.decode.num_instances}D"
    slo = load_slo(slo_name)
    num = max(1, opts.num_gpus // opts.tp_decode)
    return [bench(f"{label}: disaggregated {shape}", disaggregated_cluster(model, hw, opts), requests, repeats, slo),
            bench(f"{label}: colocated {num} x TP{opts.tp_decode}", colocated_cluster(model, hw, opts), requests,
                  repeats, slo)]


def _in_mode(compiled: bool, index: int, args) -> list[dict]:
    env = dict(os.environ)
    env.pop("TRTPD_NO_ACCEL", None)
    if not compiled:
        env["TRTPD_NO_ACCEL"] = "1"
    out = subprocess.run([sys.executable, __file__, "--scenario", str(index), "--num-requests",
                          str(args.num_requests), "--repeats", str(args.repeats)], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-requests", type=int, default=50_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--scenario", type=int, default=None, help="(internal) one scenario, here, as JSON")
    args = ap.parse_args()
    from trtpd import accel
    if args.scenario is not None:
        loaded = len(accel.status().loaded)
        rows = scenario(args.scenario, args.num_requests, args.repeats)
        for row in rows:
            row["compiled_modules"] = loaded
        json.dump(rows, sys.stdout)
        return
    print(accel.status().describe())
    print(f"simulated requests per second (best of {args.repeats}, and the median), compiled modules against "
          f"the Python source in the same run:")
    for i in range(len(SCENARIOS)):
        pure, compiled = _in_mode(False, i, args), _in_mode(True, i, args)
        for p, c in zip(pure, compiled):
            best_p, best_c = min(p["times"]), min(c["times"])
            n = c["num_requests"]
            print(f"  {c['label']:<58} compiled ({c['compiled_modules']} modules) {n / best_c:>7,.0f} requests/s "
                  f"(median {n / statistics.median(c['times']):,.0f}), Python {n / best_p:>7,.0f} "
                  f"(median {n / statistics.median(p['times']):,.0f}): {best_p / best_c:.2f}x; "
                  f"{c['num_events'] / n:.1f} events/request; "
                  f"{c['policy'] + ' policy; ' if c['policy'] else ''}SLO attainment {c['attainment']:.0%}")


if __name__ == "__main__":
    main()
