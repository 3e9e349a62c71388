"""Time of a full plan search (goal: under 1 s): every TP pair and count, then the simulator check.

Run: .venv/bin/python benchmarks/plan_search.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

from trtpd.catalog import get_model
from trtpd.perf.hardware import load_hardware
from trtpd.planner.inputs import SearchSpace, Target, load_slo
from trtpd.planner.make import VerifyOptions, make_plan
from trtpd.planner.search import PlanProblem, plan_search
from trtpd.sim.workload import load_workload

CASES = (
    ("chat-powerlaw 40 req/s, h100", "h100-sxm", "chat-powerlaw", "chat", Target(rate_per_s=40), None),
    ("chat-powerlaw 200 req/s, h100", "h100-sxm", "chat-powerlaw", "chat", Target(rate_per_s=200), None),
    ("seed004 5M tok/min, h200, <= 16 GPUs", "h200", "seed004", "seed004", Target(tokens_per_min=5e6), 16),
    ("chat-bursty, best rate within 16 GPUs", "h100-sxm", "chat-bursty", "chat", None, 16),
)


def timed(fn, repeats: int):
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    model = get_model("llama-2-70b")
    print(f"plan search time (best of {args.repeats}; 4 x 4 TP pairs; verification: 6,000 simulated requests "
          f"per run, default settings of `trtpd plan`):")
    for label, hw, wl, slo, target, max_gpus in CASES:
        problem = PlanProblem(model, load_hardware(hw), load_workload(wl), load_slo(slo), target,
                              SearchSpace(max_gpus=max_gpus))
        t_search, _ = timed(lambda: plan_search(problem), args.repeats)
        t_full, plan = timed(lambda: make_plan(problem, VerifyOptions()), args.repeats)
        sims = len(plan.verification.simulations) if plan.verification else 0
        shape = f"{plan.prefill.num_instances}P{plan.decode.num_instances}D" if plan.prefill else "none"
        print(f"  {label:<40} search {t_search * 1e3:6.0f} ms, with simulator check {t_full * 1e3:6.0f} ms "
              f"({sims} simulations) -> {shape}, {plan.num_gpus} GPUs, feasible={plan.feasible}")


if __name__ == "__main__":
    main()
