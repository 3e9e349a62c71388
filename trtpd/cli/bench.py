"""`trtpd bench`: a workload against running targets (a fleet's OpenAI gateway, an OpenAI URL, or a
single-server deployment's Triton gRPC), at one or more rates; percentiles, SLO attainment, goodput,
a Markdown report with plots, JSON and a trace."""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from trtpd.bench.options import BenchDefaults
from trtpd.cli import args as a
from trtpd.errors import ConfigError

D = BenchDefaults()


def positive_float_list(text: str) -> list[float]:
    """Comma-separated positive numbers: `1,2,4` (a single value's error reads like --rate's always did)."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated positive numbers, e.g. 1,2,4")
    try:
        values = [float(x) for x in items]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text}: expected a number or comma-separated numbers, e.g. 1,2,4") \
            from None
    if min(values) <= 0:
        raise argparse.ArgumentTypeError(f"{text}: must be a positive number" if len(values) == 1
                                         else f"{text}: every rate must be a positive number")
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"{text}: a rate is given twice")
    return values


positive_float_list.__name__ = "positive_float_list"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench", help="run a workload against running deployments or fleets",
        description="Open-loop load (Poisson or Gamma arrivals, the workload's length distributions) against a "
                    "fleet's OpenAI gateway (--name of a fleet started with `trtpd up --fleet`, or --url), or a "
                    "single-server deployment's Triton gRPC streaming endpoint (--name of `trtpd up`). With "
                    "--compare, the same requests go to each target, one after the other; with several --rate "
                    "values, each rate in turn. Prints TTFT/ITL/TPOT and worst-stall percentiles, tokens/s, SLO "
                    "attainment and goodput; writes a Markdown report with PNG plots (--report), JSON (--json) "
                    "and the per-request trace (--trace, replayable with a `trace:` workload in `trtpd simulate`).")
    p.add_argument("--name", default=D.name, help="deployment or fleet name (default: %(default)s)")
    p.add_argument("--url", help="an OpenAI-compatible base URL instead of --name, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--compare", action="append", metavar="NAME_OR_URL",
                   help="another target (fleet or deployment name, or URL) that gets the same requests; repeatable")
    p.add_argument("--model", help="the OpenAI `model` to request (default: the first one the server's /v1/models "
                                   "lists; Triton targets: the ensemble)")
    p.add_argument("--api-key-file", type=Path, metavar="FILE",
                   help="the API key for --url targets (first line of FILE; default: $OPENAI_API_KEY); a fleet "
                        "named with --name uses its own key")
    p.add_argument("--tokenizer", type=Path, metavar="CHECKPOINT_DIR",
                   help="the reference checkpoint folder whose tokenizer sizes the prompts (default: the target's; "
                        "needed with --url alone)")
    p.add_argument("--workload", default=D.workload, help="workload name or YAML (default: %(default)s)")
    p.add_argument("--arrival", choices=("poisson", "gamma"),
                   help="the arrival process (default: the workload's); gamma needs --cv unless the workload has one")
    p.add_argument("--cv", type=a.positive_float,
                   help="Gamma arrivals: coefficient of variation of the inter-arrival times (2: bursty; implies "
                        "--arrival gamma)")
    p.add_argument("--rate", type=positive_float_list, default=[float(D.rates)], metavar="R[,R...]",
                   help=f"requests per second; several (1,2,4) run one after another (default: {D.rates})")
    p.add_argument("--num-requests", type=a.positive_int, default=D.num_requests, help="requests per run")
    p.add_argument("--seed", type=int, default=D.seed, help="random seed of the workload")
    p.add_argument("--ttft-slo-ms", type=a.positive_float, help="with --tpot-slo-ms: report SLO attainment, goodput")
    p.add_argument("--tpot-slo-ms", type=a.positive_float, help="with --ttft-slo-ms: report SLO attainment, goodput")
    p.add_argument("--attainment", type=a.fraction, default=D.attainment,
                   help="goodput: the share of requests that must meet both SLOs")
    p.add_argument("--warmup", type=a.nonnegative_int, default=D.warmup,
                   help="unmeasured requests sent to each target before its first run")
    p.add_argument("--timeout-s", type=a.positive_float, default=D.timeout_s, help="per run")
    p.add_argument("--report", type=Path, metavar="OUT.md", help="Markdown report; PNG plots are written next to it")
    p.add_argument("--json", type=Path, metavar="OUT.json", help="every run: settings, summaries, goodput, "
                                                                 "per-request timings")
    p.add_argument("--output", type=Path, help="summary JSON (one run: its summary; several: a list)")
    p.add_argument("--trace", type=Path, help="per-request CSV: arrival_s, input_tokens, output_tokens, ttft_s, "
                                              "tpot_s, error (several runs: also target, rate_per_s)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if (args.ttft_slo_ms is None) != (args.tpot_slo_ms is None):
        raise ConfigError("--ttft-slo-ms and --tpot-slo-ms: give both (SLO attainment needs both targets) or neither")
    if args.url and "name" in a.given(args):
        raise ConfigError("--name and --url: give one target (another goes in --compare)")
    from rich.console import Console
    from rich.table import Table

    from trtpd.bench.report import Sweep, goodput_table, rate_table, write_json, write_report
    from trtpd.bench.sweep import load_tokenizer, make_requests, resolve_target, run_sweep, unique_labels, with_arrival
    from trtpd.sim.workload import load_workload

    console = Console()
    key = None
    if args.api_key_file:
        from trtpd.gateway.api_keys import first_key, read_api_keys
        read_api_keys(args.api_key_file)   # refused when others can read it
        key = first_key(args.api_key_file)
    targets = unique_labels([resolve_target(t, args.model, key) for t in [args.url or args.name, *(args.compare or [])]])
    spec = with_arrival(load_workload(args.workload), args.arrival, args.cv)
    if spec.trace is not None and len(args.rate) > 1:
        raise ConfigError(f"--rate {','.join(f'{r:g}' for r in args.rate)}: workload {spec.name!r} replays a trace "
                          f"at its own times; give one rate")
    tokenizer = load_tokenizer(targets, args.tokenizer)
    max_input_len = min(t.max_input_len for t in targets)
    slo = (args.ttft_slo_ms / 1e3, args.tpot_slo_ms / 1e3) if args.ttft_slo_ms else (None, None)
    sweep = Sweep(spec.name, spec.arrival.process, spec.arrival_cv, args.num_requests, args.seed, *slo,
                  args.attainment, [t.info for t in targets], list(args.rate))
    arrival = "Poisson" if spec.arrival.process == "poisson" else f"Gamma (CV {spec.arrival_cv:g})"
    console.print(f"  workload {spec.name}: {args.num_requests} requests per run, {arrival} arrivals at "
                  f"{', '.join(f'{r:g}' for r in args.rate)} requests/s")
    for t in targets:
        console.print(f"  target {t.label}: {t.info.kind} {t.info.url} (model {t.model})")
    prompts: dict = {}
    sent: dict[float, list] = {}

    def requests_at(rate: float):
        sent[rate] = make_requests(tokenizer, spec, rate, args.num_requests, args.seed, max_input_len, prompts)
        return sent[rate]

    run_sweep(targets, sweep, requests_at, timeout_s=args.timeout_s, warmup=args.warmup, console=console)

    for rate in sweep.rates:
        head, *rows = rate_table(sweep, rate)
        table = Table(*head, title=f"{rate:g} requests/s")
        for row in rows:
            table.add_row(*row)
        console.print(table)
    if sweep.has_slo:
        head, *rows = goodput_table(sweep)
        table = Table(*head, title="goodput (DistServe: highest rate at which attainment >= the target)")
        for row in rows:
            table.add_row(*row)
        console.print(table)
    if args.report:
        files = write_report(sweep, args.report)
        console.print(f"  report: {files[0]} (plots: {', '.join(f.name for f in files[1:])})")
    if args.json:
        console.print(f"  JSON: {write_json(sweep, args.json)}")
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        summaries = [{"target": r.target, "rate_per_s": r.rate_per_s,
                      "summary": sweep.summary(r.target, r.rate_per_s).to_dict()} for r in sweep.runs]
        args.output.write_text(json.dumps(summaries[0]["summary"] if len(summaries) == 1 else summaries, indent=2))
    if args.trace:
        _write_trace(args.trace, sweep, sent)
    return 1 if any(r.error is not None for run in sweep.runs for r in run.results) else 0


def _write_trace(path: Path, sweep, sent: dict[float, list]) -> None:
    several = len(sweep.runs) > 1
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["arrival_s", "input_tokens", "output_tokens", "ttft_s", "tpot_s", "error"]
                   + (["target", "rate_per_s"] if several else []))
        for run in sweep.runs:
            for req, res in zip(sent[run.rate_per_s], run.results):
                w.writerow([f"{req.send_at_s:.6f}", req.num_prompt_tokens, req.max_tokens,
                            "" if res.ttft_s is None else f"{res.ttft_s:.6f}",
                            "" if res.tpot_s is None else f"{res.tpot_s:.6f}", res.error or ""]
                           + ([run.target, f"{run.rate_per_s:g}"] if several else []))
