"""`trtpd bench`: a workload against a running deployment, with TTFT/TPOT percentiles and a trace."""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from trtpd.cli import args as a
from trtpd.errors import ConfigError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="run a workload against a running deployment",
                       description="Open-loop load (Poisson or Gamma arrivals, the workload's length distributions) "
                                   "over Triton's gRPC streaming endpoint of a deployment started with `trtpd up`; "
                                   "prints TTFT/TPOT percentiles, tokens/s and SLO attainment, and can write the "
                                   "per-request trace (replayable with a `trace:` workload in `trtpd simulate`).")
    p.add_argument("--name", default="default", help="deployment name (default: %(default)s)")
    p.add_argument("--workload", default="cpu-demo", help="workload name or YAML (default: %(default)s)")
    p.add_argument("--rate", type=a.positive_float, default=3.0, help="requests per second (default: %(default)s)")
    p.add_argument("--num-requests", type=a.positive_int, default=40, help="requests to send")
    p.add_argument("--seed", type=int, default=0, help="random seed of the workload")
    p.add_argument("--ttft-slo-ms", type=a.positive_float, help="with --tpot-slo-ms: report SLO attainment")
    p.add_argument("--tpot-slo-ms", type=a.positive_float, help="with --ttft-slo-ms: report SLO attainment")
    p.add_argument("--output", type=Path, help="summary JSON")
    p.add_argument("--trace", type=Path, help="per-request CSV: arrival_s, input_tokens, output_tokens, ttft_s, tpot_s")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if (args.ttft_slo_ms is None) != (args.tpot_slo_ms is None):
        raise ConfigError("--ttft-slo-ms and --tpot-slo-ms: give both (SLO attainment needs both targets) or neither")
    from rich.console import Console
    from rich.table import Table

    from trtpd.bench.run import bench_url, make_requests
    from trtpd.bench.stats import comparison_table, summarize
    from trtpd.engine.checkpoint import load_checkpoint
    from trtpd.serving.deployment import Deployment

    dep = Deployment.load(args.name)
    tokenizer = load_checkpoint(Path(dep.build_root) / "checkpoint").load_tokenizer()
    requests = make_requests(tokenizer, args.workload, args.rate, args.num_requests, args.seed, 2048)
    results = bench_url(dep.server.grpc_url, requests, args.name)
    slo = (args.ttft_slo_ms / 1e3, args.tpot_slo_ms / 1e3) if args.ttft_slo_ms else (None, None)
    summary = summarize(f"{args.name} ({dep.mode})", results, *slo)
    table = Table("metric", summary.label)
    for row in comparison_table([summary]):
        table.add_row(*row)
    Console().print(table)
    if args.output:
        args.output.write_text(json.dumps(summary.to_dict(), indent=2))
    if args.trace:
        with open(args.trace, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["arrival_s", "input_tokens", "output_tokens", "ttft_s", "tpot_s", "error"])
            for req, res in zip(requests, results):
                w.writerow([f"{req.send_at_s:.6f}", req.num_prompt_tokens, req.max_tokens,
                            "" if res.ttft_s is None else f"{res.ttft_s:.6f}",
                            "" if res.tpot_s is None else f"{res.tpot_s:.6f}", res.error or ""])
    return 1 if summary.num_errors else 0
