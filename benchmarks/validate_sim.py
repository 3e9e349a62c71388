"""Simulation vs reality: the same requests through the real deployments and through the simulator.

1. profile the reference engine on this machine (`trtpd profile` into a temporary hardware file),
2. run a workload (same file, rate and seed) through the disaggregated (1P1D) and the colocated
   (2 instances) deployments of the real tritonserver, streaming over gRPC,
3. simulate exactly those requests (arrivals and lengths) on clusters that mirror the engines'
   scheduler settings and KV pools, with the measured latency curves,
4. print P50/P90 TTFT and TPOT side by side with the relative error (goal: within 15%).
Run: .venv/bin/python benchmarks/validate_sim.py [--rate 3] [--num-requests 60] [--seed 0]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

from trtpd.bench.run import bench_url, make_requests
from trtpd.catalog import get_model
from trtpd.engine.reference_engines import build_reference
from trtpd.engine.checkpoint import load_checkpoint
from trtpd.perf.hardware import load_hardware
from trtpd.repo.reference import ReferenceDeployment
from trtpd.fleet import deployment
from trtpd.sim.cluster_specs import ClusterOptions, colocated_cluster, disaggregated_cluster, options_from_engines
from trtpd.sim.metrics import latencies
from trtpd.sim.simulator import simulate
from trtpd.sim.workload import generate_requests, load_workload


def pct(values, p) -> float:
    x = np.asarray([v for v in values if v is not None and not np.isnan(v)], dtype=float)
    return float(np.percentile(x, p)) if x.size else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=3.0)
    ap.add_argument("--num-requests", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workload", default="cpu-demo")
    ap.add_argument("--engines-dir", type=Path, default=Path("engines"))
    ap.add_argument("--profile", type=Path, help="hardware YAML with measured curves and serving overhead "
                    "(default: measure now with `trtpd profile --serving`)")
    ap.add_argument("--kv-link-bytes-per-s", type=float, default=10e9, help="shm transfer bandwidth")
    args = ap.parse_args()

    root = build_reference("tiny-llama", args.engines_dir)[0].parent
    hw_path = args.profile
    if hw_path is None:
        hw_path = Path(tempfile.mkdtemp()) / "cpu-measured.yaml"
        print(f"profiling the reference engine into {hw_path} ...", flush=True)
        subprocess.run([sys.executable, "-m", "trtpd.cli.main", "profile", "--backend", "reference",
                        "--engine-dir", str(root), "--output", str(hw_path), "--serving"], check=True, stdout=subprocess.DEVNULL)
    hardware = load_hardware(str(hw_path))
    tokenizer = load_checkpoint(root / "checkpoint").load_tokenizer()
    requests = make_requests(tokenizer, args.workload, args.rate, args.num_requests, args.seed, 2048)
    arrays = generate_requests(load_workload(args.workload), args.rate, args.num_requests, args.seed)
    assert [r.max_tokens for r in requests] == list(arrays.output_tokens)

    real = {}
    for mode in ("disaggregated", "colocated"):
        dep = deployment.up(f"validate-{mode}", ReferenceDeployment(root, mode=mode, colocated_instances=2),
                            replace=True)
        try:
            bench_url(dep.server.grpc_url, [replace(requests[0], request_id="warmup", send_at_s=0.0)], "warmup")
            results = bench_url(dep.server.grpc_url, requests, mode)
        finally:
            deployment.down(dep.name)
        errors = [r.error for r in results if r.error]
        if errors:
            print(f"{mode}: {len(errors)} errors, e.g. {errors[0]}")
        real[mode] = ([r.ttft_s for r in results], [r.tpot_s for r in results])

    model = get_model("tiny-llama")
    opts = options_from_engines(root, ClusterOptions(num_colocated=2, kv_link_bytes_per_s=args.kv_link_bytes_per_s,
                                                     first_token_at="decode"))
    clusters = {"disaggregated": disaggregated_cluster(model, hardware, opts),
                "colocated": colocated_cluster(model, hardware, opts)}
    print(f"\n{args.num_requests} requests of {args.workload} at {args.rate}/s, seed {args.seed}; "
          f"simulated with curves from {hw_path}")
    print(f"{'mode':<14} {'metric':<9} {'real ms':>9} {'sim ms':>9} {'error':>7}")
    worst = 0.0
    for mode, cluster in clusters.items():
        lat = latencies(simulate(cluster, arrays), warmup_fraction=0.0)
        sim = (list(lat.ttft_s), list(lat.tpot_s))
        for i, name in enumerate(("TTFT", "TPOT")):
            for p in (50, 90):
                r, s = pct(real[mode][i], p) * 1e3, pct(sim[i], p) * 1e3
                err = (s - r) / r
                worst = max(worst, abs(err))
                print(f"{mode:<14} {name} P{p:<4} {r:>9.1f} {s:>9.1f} {err:>+7.0%}")
    print(f"largest |error|: {worst:.0%} (goal: 15%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
