"""Seed 004's worked example through both methods: DeepSeek-V3.1 on H200, 5M tokens/min, L_in 6144,
L_out 512, TTFT <= 2 s, TPOT <= 20 ms.

1. The seed's formula with the seed's own measured inputs (TP_prefill_max 28,300 tokens/s, T_overhead
   0.1 s, batch 34 at TPOT 20 ms).
2. The seed's formula on trtpd's performance curves (roofline: MoE active FLOPs, experts hit per step,
   MLA latents) for the TP the planner picked.
3. trtpd's planner: queueing per role, the KV link, the simulator's check, colocated beside it.

Run: .venv/bin/python benchmarks/seed004_deepseek.py [--no-colocated] [--verify-requests 3000]
"""

from __future__ import annotations

import argparse
import time

from trtpd.catalog import get_model
from trtpd.perf.hardware import load_hardware
from trtpd.planner import throughput_ratio
from trtpd.planner.inputs import SearchSpace, Slo, Target
from trtpd.planner.make import VerifyOptions, make_plan
from trtpd.planner.report import plan_text
from trtpd.planner.search import PlanProblem
from trtpd.sim.workload import load_workload

TOKENS_PER_MIN, L_IN, L_OUT = 5e6, 6144, 512
SLO = Slo(ttft_s=2.0, tpot_s=0.020)


def seed_answer(tp_prefill_max: float, overhead_s: float, batch: int, tpot_s: float) -> throughput_ratio.Seed004Plan:
    tp_prefill = throughput_ratio.prefill_throughput_under_ttft(tp_prefill_max, L_IN, SLO.ttft_s, overhead_s)
    tp_decode = throughput_ratio.decode_throughput(batch, tpot_s)
    return throughput_ratio.instance_counts(TOKENS_PER_MIN / 60, L_IN, L_OUT, tp_prefill, tp_decode)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--no-colocated", action="store_true")
    ap.add_argument("--verify-requests", type=int, default=3000)
    args = ap.parse_args()
    model = get_model("deepseek-v3.1")
    problem = PlanProblem(model, load_hardware("h200"), load_workload("seed004"), SLO,
                          Target(tokens_per_min=TOKENS_PER_MIN), SearchSpace(tp_prefill=[8], tp_decode=[8]))
    print(f"{model.name}: {model.num_params / 1e9:.1f}B parameters ({model.num_active_params / 1e9:.1f}B active), "
          f"KV {model.kv_bytes_per_token('fp8')} bytes per token in fp8 (MLA latent); fp8 weights on H200 need "
          f"TP >= 8 (TP 16 spans nodes)")
    s = seed_answer(28300, 0.1, 34, 0.020)
    print(f"1. seed formula, seed's inputs: N_prefill {s.prefill_instances_exact:.2f}, N_decode "
          f"{s.decode_instances_exact:.2f}: the seed rounds to {s.seed_num_prefill}P{s.seed_num_decode}D "
          f"(sustains {s.seed_max_tokens_per_min / 1e6:.2f}M tokens/min); rounded up {s.num_prefill}P{s.num_decode}D "
          f"= {8 * (s.num_prefill + s.num_decode)} GPUs at TP8")
    t0 = time.perf_counter()
    plan = make_plan(problem, VerifyOptions(num_requests=args.verify_requests, compare_colocated=not args.no_colocated,
                                            compare_requests=1500))
    elapsed = time.perf_counter() - t0
    f = plan.seed004 or {}
    if "num_prefill" in f:
        print(f"2. seed formula, trtpd's curves (TP8): TP_prefill_max {f['tp_prefill_max_tokens_per_s']:.0f} tokens/s, "
              f"usable {f['tp_prefill_tokens_per_s']:.0f}; decode batch {f['decode_batch']:.0f} at TPOT 20 ms = "
              f"{f['tp_decode_tokens_per_s']:.0f} tokens/s -> {f['num_prefill']:.0f}P{f['num_decode']:.0f}D")
    print(f"3. trtpd plan ({elapsed:.1f} s):")
    print(plan_text(plan))


if __name__ == "__main__":
    main()
