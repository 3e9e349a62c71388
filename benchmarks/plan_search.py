"""Time of a full plan search (goal: under 1 s): every TP pair and count, the simulator check, and the
colocated comparison (each side's goodput simulated), as `trtpd plan` runs by default.

Run: .venv/bin/python benchmarks/plan_search.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

from trtpd.catalog import get_model
from trtpd.perf.hardware import load_hardware
from trtpd.planner.inputs import SearchSpace, Slo, Target, load_slo
from trtpd.planner.make import VerifyOptions, make_plan
from trtpd.planner.search import PlanProblem, plan_search
from trtpd.sim.lengths import FixedLengths
from trtpd.sim.workload import load_workload


def _fixed(name: str, input_tokens: int, output_tokens: int):
    wl = load_workload(name)
    return wl.model_copy(update={"input_tokens": FixedLengths(kind="fixed", tokens=input_tokens),
                                 "output_tokens": FixedLengths(kind="fixed", tokens=output_tokens)})


CASES = (
    # (label, model, hardware, workload, slo, target, max_gpus)
    ("issue 10: 70B 512/256, 8 GPUs, TTFT 0.2 TPOT 0.04", "llama-3.1-70b", "h100-sxm",
     lambda: _fixed("chat-powerlaw", 512, 256), Slo(ttft_s=0.2, tpot_s=0.04), None, 8),
    ("chat-powerlaw 40 req/s, h100", "llama-2-70b", "h100-sxm", lambda: load_workload("chat-powerlaw"),
     load_slo("chat"), Target(rate_per_s=40), None),
    ("chat-powerlaw 200 req/s, h100", "llama-2-70b", "h100-sxm", lambda: load_workload("chat-powerlaw"),
     load_slo("chat"), Target(rate_per_s=200), None),
    ("seed004 5M tok/min, h200, <= 16 GPUs", "llama-2-70b", "h200", lambda: load_workload("seed004"),
     load_slo("seed004"), Target(tokens_per_min=5e6), 16),
    ("chat-bursty, best rate within 16 GPUs", "llama-2-70b", "h100-sxm", lambda: load_workload("chat-bursty"),
     load_slo("chat"), None, 16),
)


def timed(fn, repeats: int):
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return times, out


def spread(times: list[float]) -> str:
    return f"{min(times) * 1e3:5.0f}/{statistics.median(times) * 1e3:5.0f}/{max(times) * 1e3:5.0f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print(f"plan search time, min/median/max of {args.repeats} (in process; 4 x 4 TP pairs unless said; "
          f"verification: 6,000 simulated requests per run; default settings of `trtpd plan`, colocated "
          f"comparison included):")
    for label, model, hw, workload, slo, target, max_gpus in CASES:
        problem = PlanProblem(get_model(model), load_hardware(hw), workload(), slo, target,
                              SearchSpace(max_gpus=max_gpus))
        t_search, _ = timed(lambda: plan_search(problem), args.repeats)
        t_full, plan = timed(lambda: make_plan(problem, VerifyOptions()), args.repeats)
        sims = len(plan.verification.simulations) if plan.verification else 0
        shape = f"{plan.prefill.num_instances}P{plan.decode.num_instances}D" if plan.prefill else "none"
        answer = plan.comparison.recommended if plan.comparison else "-"
        print(f"  {label:<52} search {spread(t_search)}, full {spread(t_full)} ({sims} verification "
              f"simulations) -> {shape}, {plan.num_gpus} GPUs, feasible={plan.feasible}, recommended {answer}")


if __name__ == "__main__":
    main()
