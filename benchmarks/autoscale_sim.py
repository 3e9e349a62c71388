"""Autoscaling against the best fixed prefill/decode split, in the simulator, on day/night workloads.

Seed 000 5.2: DistServe moves instances between the roles as the prefill:decode load ratio shifts (by day
many prefill, by night many decode). Each scenario simulates a day/night workload (configs/workloads/
daynight*.yaml) with the controller's autoscaler (trtpd.autoscale.core) acting every few seconds,
and every fixed split within the same budget (trtpd.autoscale.fixed_splits; the autoscaled run starts at the best one).
Run:
    .venv/bin/python benchmarks/autoscale_sim.py [--startup-s 30]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from trtpd.catalog import resolve_model
from trtpd.autoscale.simulated import compare_autoscaled, load_policy
from trtpd.perf.hardware import load_hardware
from trtpd.planner.inputs import load_slo
from trtpd.sim.cluster_specs import disaggregated_cluster
from trtpd.sim.options import ClusterOptions
from trtpd.sim.workload import generate_requests, load_workload

# a responsive policy: decide every 5 s on the last 15 s, at most one change per role every 20 s
POLICY = "cooldown_s=20,interval_s=5,window_s=15,scale_up_utilisation=0.9"


@dataclass(frozen=True)
class Scenario:
    label: str
    model: str
    hardware: str
    workload: str
    slo: str
    budget: int                  # in devices (GPUs, cores); an instance costs its TP
    options: ClusterOptions


SCENARIOS = (
    Scenario("tiny-llama, cpu-reference, 1 core/instance", "tiny-llama", "cpu-reference", "daynight-cpu",
             "reference-cpu", 8, ClusterOptions(weight_dtype="fp32", kv_dtype="fp16", prefill_max_num_tokens=2048,
                                                decode_max_batch_size=32)),
    Scenario("llama-2-70b fp8, h200, TP2/instance", "llama-2-70b", "h200", "daynight", "chat", 20,
             ClusterOptions(tp_prefill=2, tp_decode=2, weight_dtype="fp8", kv_dtype="fp8",
                            decode_max_batch_size=256)),
)


def run(s: Scenario, startup_s: float) -> list[str]:
    t0 = time.perf_counter()
    opts = s.options
    cluster = disaggregated_cluster(resolve_model(s.model), load_hardware(s.hardware), opts)
    policy = load_policy(f"budget={s.budget},{POLICY}", {"prefill": opts.tp_prefill, "decode": opts.tp_decode})
    requests = generate_requests(load_workload(s.workload), None, None, seed=0)
    r = compare_autoscaled(cluster, requests, policy, load_slo(s.slo), startup_s)
    wall_s = time.perf_counter() - t0
    changes = [d for d in r.decisions if d.changed]
    day = max((d.counts["prefill"], d.counts["decode"]) for d in changes if d.now_s < requests.duration_s / 2)
    night = max((d.counts["decode"], d.counts["prefill"]) for d in changes if d.now_s >= requests.duration_s / 2)
    rows = []
    for label, res in (("best fixed " + r.best_fixed.label, r.best_fixed), ("autoscaled", r.autoscaled)):
        rows.append(f"  {label:<18} {res.attainment:>9.1%} {res.summary.goodput_per_s:>10.2f} "
                    f"{res.instance_s:>11.0f} {res.summary.ttft_s.p90:>9.2f} {res.summary.tpot_s.p90 * 1e3:>9.1f}")
    return [f"{s.label}: {s.workload}, {len(requests)} requests over {requests.duration_s:.0f} s, SLO {s.slo}, "
            f"budget {s.budget} devices; {len(r.fixed)} of {r.num_splits} fixed splits simulated; "
            f"{len(changes)} scaling decisions (peak by day {day[0]}P{day[1]}D, by night {night[1]}P{night[0]}D); "
            f"{wall_s:.0f} s wall",
            f"  {'':<18} {'attainment':>9} {'goodput/s':>10} {'instance-s':>11} {'TTFT P90':>9} {'TPOT P90':>9}",
            *rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--startup-s", type=float, default=30.0, help="an added instance's start-up time")
    args = ap.parse_args()
    print(f"autoscaled vs best fixed split (policy {POLICY}, start-up {args.startup_s:g} s; "
          f"TTFT P90 in s, TPOT P90 in ms)")
    for s in SCENARIOS:
        print("\n".join(run(s, args.startup_s)))


if __name__ == "__main__":
    main()
