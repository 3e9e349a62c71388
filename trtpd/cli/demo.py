"""`trtpd demo`: the main job on the CPU reference backend."""

from __future__ import annotations

import argparse
from pathlib import Path

from trtpd.bench.options import PROFILE_NAME, DemoOptions
from trtpd.cli import args as a


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="build, deploy and compare disaggregated vs colocated on this CPU",
                       description="Build the reference engines, run the same workload through a disaggregated and "
                                   "a colocated fleet (each instance its own tritonserver) behind the OpenAI "
                                   "gateway with the openai client, print TTFT, ITL, TPOT, worst stall and tokens/s "
                                   "side by side, stop everything; then simulate the same requests on this "
                                   "machine's measured profile and print the prediction against the run.")
    d = DemoOptions()
    p.add_argument("--rate", type=a.positive_float, default=d.rate_per_s, help="requests per second")
    p.add_argument("--num-requests", type=a.positive_int, default=d.num_requests, help="requests per deployment")
    p.add_argument("--workload", default=d.workload, help="workload name or YAML")
    p.add_argument("--kv-dtype", default=d.kv_dtype, choices=("fp16", "bf16", "fp8"), help="KV cache dtype")
    p.add_argument("--kv-transport", default=d.kv_transport, choices=("shm", "tcp", "ucx", "mpi"),
                   help="KV transfer between prefill and decode")
    p.add_argument("--colocated-instances", type=a.positive_int, default=d.colocated_instances,
                   help="instances of the colocated deployment")
    p.add_argument("--seed", type=int, default=d.seed, help="random seed of the workload")
    p.add_argument("--engines-dir", type=Path, default=d.engines_dir, help="where the reference engines are built")
    p.add_argument("--output", type=Path, default=d.output, help="JSON results (default: %(default)s)")
    p.add_argument("--profile", type=Path, default=None,
                   help="predict with this hardware profile (from `trtpd profile --serving`) instead of measuring "
                        f"this machine first (about a minute and a half, into {PROFILE_NAME} beside --output)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trtpd.bench.run import run_demo

    run_demo(DemoOptions(engines_dir=args.engines_dir, kv_dtype=args.kv_dtype, kv_transport=args.kv_transport,
                         workload=args.workload, rate_per_s=args.rate, num_requests=args.num_requests, seed=args.seed,
                         colocated_instances=args.colocated_instances, output=args.output, profile=args.profile))
    return 0
