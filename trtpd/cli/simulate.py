"""`trtpd simulate`: run a workload through a simulated deployment (a plan file, or explicit flags).

With --autoscale, the controller's autoscaler runs inside the simulation and is compared with the best fixed
prefill/decode split under the same budget (trtpd.autoscale.simulated; this module parses and prints).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace
from pathlib import Path

from trtpd.autoscale import POLICY_KEYS
from trtpd.cli import args as a
from trtpd.errors import ConfigError
from trtpd.sim.options import ClusterOptions

_CLUSTER_FLAGS = (
    ("--num-prefill", a.positive_int), ("--num-decode", a.positive_int), ("--tp-prefill", a.positive_int),
    ("--tp-decode", a.positive_int), ("--prefill-kv-capacity-tokens", a.positive_int),
    ("--decode-kv-capacity-tokens", a.positive_int), ("--prefill-max-num-tokens", a.positive_int),
    ("--prefill-max-batch-size", a.positive_int), ("--decode-max-batch-size", a.positive_int),
    ("--num-colocated", a.positive_int), ("--tp-colocated", a.positive_int), ("--kv-capacity-tokens", a.positive_int),
    ("--colocated-max-num-tokens", a.positive_int), ("--colocated-max-batch-size", a.positive_int),
    ("--kv-link-bytes-per-s", a.positive_float), ("--kv-link-latency-s", a.nonnegative_float),
    ("--bucket-timeout-s", a.nonnegative_float))
_DERIVED = {"kv_link_bytes_per_s": "from the hardware", "kv_capacity_tokens": "from the perf model",
            "prefill_kv_capacity_tokens": "--kv-capacity-tokens", "decode_kv_capacity_tokens": "--kv-capacity-tokens",
            "num_colocated": "as many instances as the P/D pair's GPUs", "tp_colocated": "--tp-decode",
            "colocated_max_num_tokens": "--prefill-max-num-tokens + the batch (chunked: the step's token budget)",
            "colocated_max_batch_size": "--decode-max-batch-size",
            "weight_dtype": "fp16, or the hardware profile's own when it has no fp16 figure"}


def _cluster_default(flag: str) -> str:
    dest = flag[2:].replace("-", "_")
    value = ClusterOptions.__dataclass_fields__[dest].default
    return f"(default: the plan's, else {_DERIVED.get(dest, value)})"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="discrete-event simulation of a disaggregated (and colocated) deployment",
                       description="Simulate a workload on a plan (--plan) or on explicit instance counts, "
                                   "disaggregated and/or colocated on the same GPUs; print TTFT/TPOT percentiles, "
                                   "SLO attainment and goodput.")
    p.add_argument("--plan", type=Path, help="plan YAML written by `trtpd plan`")
    p.add_argument("--engines", type=Path,
                   help="a reference build folder (engines/<model>/reference-<kv>): mirror its scheduler settings "
                        "and KV pools (use with --model tiny-llama --hardware cpu-reference)")
    p.add_argument("--model", default=None, help="catalog name (default: the plan's, else llama-2-70b)")
    p.add_argument("--hardware", default=None, help="hardware name or YAML (default: the plan's, else h100-sxm); "
                                                    "a profile with measured curves uses them")
    p.add_argument("--workload", default="chat-powerlaw", help="configs/workloads name or YAML path")
    p.add_argument("--slo", default="chat", help="SLO used for attainment and goodput")
    p.add_argument("--rate-per-s", type=a.positive_float, help="arrival rate (default: the plan's target)")
    p.add_argument("--num-requests", type=a.positive_int,
                   help="requests to simulate (default: 10000; a phased workload: one whole pass)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the workload")
    p.add_argument("--mode", choices=("disaggregated", "colocated", "both"), default="both",
                   help="which deployments to simulate")
    p.add_argument("--find-goodput", action="store_true",
                   help="search the highest rate meeting the SLO for the attainment share (DistServe's goodput)")
    p.add_argument("--json", type=Path, help="also write the summaries as JSON here")
    p.add_argument("--no-early-stop", action="store_true",
                   help="simulate every request even when the queue grows without bound")
    g = p.add_argument_group("autoscaling (disaggregated; compared with the best fixed split in the budget)")
    g.add_argument("--autoscale", metavar="POLICY",
                   help="run the autoscaler: a policy YAML, or inline key=value pairs separated by commas "
                        f"(keys: {', '.join(POLICY_KEYS)}), or 'default'; the budget defaults to the "
                        "cluster's GPUs, an instance's cost to its TP")
    g.add_argument("--startup-s", type=a.nonnegative_float, default=30.0,
                   help="an added instance takes requests this long after it starts")
    c = p.add_argument_group("explicit cluster (overrides the plan)")
    for flag, kind in _CLUSTER_FLAGS:
        c.add_argument(flag, type=kind, help=_cluster_default(flag))
    for flag, choices in (("--weight-dtype", ("fp32", "fp16", "bf16", "fp8")), ("--kv-dtype", ("fp16", "bf16", "fp8")),
                          ("--kv-link", ("network", "nvlink")), ("--first-token-at", ("prefill", "decode")),
                          ("--colocated-policy", ("inflight", "chunked", "prefill_first"))):
        c.add_argument(flag, choices=choices, help=_cluster_default(flag))
    p.set_defaults(func=run)


def _options(args: argparse.Namespace):
    from trtpd.schema.plan import load_plan
    from trtpd.sim.cluster_specs import ClusterOptions, options_from_engines, options_from_plan

    model, hardware, rate = "llama-2-70b", "h100-sxm", None
    opts = ClusterOptions()
    if args.plan:
        plan = load_plan(args.plan)
        opts, model, hardware, rate = options_from_plan(plan), plan.model, plan.hardware, plan.target.rate_per_s
    if args.engines:
        opts = options_from_engines(args.engines, opts)
    overrides = {k: v for k, v in vars(args).items() if k in ClusterOptions.__dataclass_fields__ and v is not None}
    return replace(opts, **overrides), args.model or model, args.hardware or hardware, args.rate_per_s or rate


def _line(label: str, s) -> str:
    ms = 1e3
    b = s.ttft_breakdown
    parts = (f"{label:<14} TTFT P50/P90/P99 {s.ttft_s.p50 * ms:8.1f} {s.ttft_s.p90 * ms:8.1f} {s.ttft_s.p99 * ms:8.1f} ms"
             f" | TPOT {s.tpot_s.p50 * ms:6.1f} {s.tpot_s.p90 * ms:6.1f} {s.tpot_s.p99 * ms:6.1f} ms"
             f" | attainment {s.slo_attainment:6.1%} | goodput {s.goodput_per_s:7.2f}/s"
             f" | {s.throughput_tokens_per_s:9.0f} tokens/s")
    if s.num_unfinished:
        parts += f" | {s.num_unfinished} unfinished"
    if b is not None:
        parts += (f"\n{'':<14} TTFT mean = prefill queue {b.prefill_queue_s * ms:.1f} + compute {b.prefill_compute_s * ms:.1f}"
                  f" + decode queue {b.decode_queue_s * ms:.1f} + KV transfer {b.kv_transfer_s * ms:.1f} ms")
    return parts


def run(args: argparse.Namespace) -> int:
    if args.find_goodput:
        a.refuse_given(args, ("no_early_stop",), "--find-goodput always stops a run early once its queue grows")
    if args.autoscale:
        a.refuse_given(args, ("find_goodput", "no_early_stop"),
                       "--autoscale compares fixed splits, each stopped early once its queue grows")
        if args.mode != "disaggregated" and "mode" in a.given(args):
            raise ConfigError(f"--mode {args.mode}: --autoscale scales a disaggregated deployment")
    else:
        a.refuse_given(args, ("startup_s",), "it applies to --autoscale only")
    from trtpd.catalog import resolve_model
    from trtpd.perf.hardware import load_hardware
    from trtpd.planner.inputs import load_slo
    from trtpd.sim.cluster_specs import colocated_cluster, disaggregated_cluster
    from trtpd.sim.goodput import max_goodput_rate_per_s
    from trtpd.sim.metrics import summarize
    from trtpd.sim.simulator import default_max_in_system, simulate
    from trtpd.sim.workload import generate_requests, load_workload

    opts, model_name, hardware_name, rate = _options(args)
    workload, slo = load_workload(args.workload), load_slo(args.slo)
    if rate is None and not args.find_goodput and not workload.phases:
        raise ConfigError("give --rate-per-s (or a --plan with a target rate, or --find-goodput)")
    model, hardware = resolve_model(model_name), load_hardware(hardware_name)
    if args.weight_dtype is None and not args.plan and not args.engines:   # the hardware's own when it lacks fp16
        opts = replace(opts, weight_dtype=hardware.default_weight_dtype(opts.weight_dtype))
    num_requests = args.num_requests or (None if workload.phases else 10000)
    if args.autoscale:
        return _run_autoscaled(args, disaggregated_cluster(model, hardware, opts), opts,
                               generate_requests(workload, rate, num_requests, args.seed), slo,
                               f"{model.name} on {hardware.name}, workload {workload.name}")
    clusters = {}
    if args.mode in ("disaggregated", "both"):
        clusters["disaggregated"] = disaggregated_cluster(model, hardware, opts)
    if args.mode in ("colocated", "both"):
        clusters["colocated"] = colocated_cluster(model, hardware, opts)
    print(f"simulate: {model.name} on {hardware.name}, workload {workload.name}, {num_requests or 'all'} requests, "
          f"SLO TTFT <= {slo.ttft_s * 1e3:.0f} ms, TPOT <= {slo.tpot_s * 1e3:.0f} ms for {slo.attainment:.0%}")
    from trtpd.cli.common import print_curves_origin
    print_curves_origin(hardware, model.name, opts.kv_dtype)
    num_colocated, tp_c = opts.num_colocated_instances, opts.colocated_tp
    print(f"  disaggregated: {opts.num_prefill} prefill (TP{opts.tp_prefill}) + {opts.num_decode} decode "
          f"(TP{opts.tp_decode}) = {opts.num_gpus} GPUs; colocated: {num_colocated} x TP{tp_c} "
          f"({opts.colocated_policy}) = {num_colocated * tp_c} GPUs")
    out = {}
    gpus = {"disaggregated": opts.num_gpus, "colocated": num_colocated * tp_c}
    for label, cluster in clusters.items():
        if args.find_goodput:
            g = max_goodput_rate_per_s(cluster, workload, slo.ttft_s, slo.tpot_s, slo.attainment,
                                       num_requests=min(num_requests or 4000, 4000), seed=args.seed,
                                       start_rate_per_s=rate or 1.0)
            print(f"{label:<14} goodput: {g.rate_per_s:.3g} requests/s ({g.rate_per_s / gpus[label]:.3g} per GPU) "
                  f"at {g.attainment:.1%} attainment, {len(g.probes)} simulations")
            out[f"{label}_goodput_per_s"] = g.rate_per_s
            continue
        run_ = simulate(cluster, generate_requests(workload, rate, num_requests, args.seed),
                        max_in_system=None if args.no_early_stop else default_max_in_system(cluster))
        summary = summarize(run_, slo.ttft_s, slo.tpot_s)
        print(_line(label, summary))
        if run_.stopped_overloaded:
            print(f"{'':<14} OVERLOADED: the queue kept growing; stopped early (--no-early-stop runs to the end)")
        out[label] = asdict(summary)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2))
    return 0


# -- autoscaling: the controller's core inside the simulator ---------------------------------------------------
def _run_autoscaled(args: argparse.Namespace, cluster, opts, requests, slo, what: str) -> int:
    from trtpd.autoscale.simulated import comparison_text, compare_autoscaled, load_policy, timeline_text

    policy = load_policy(args.autoscale, {"prefill": opts.tp_prefill, "decode": opts.tp_decode}, opts.num_gpus)
    print(f"simulate --autoscale: {what}, {len(requests)} requests over {requests.duration_s:.0f} s, "
          f"SLO TTFT <= {slo.ttft_s * 1e3:.0f} ms, TPOT <= {slo.tpot_s * 1e3:.0f} ms")
    print(f"  policy: budget {policy.budget} (cost per instance: {_roles(policy.cost_per_instance)}), "
          f"min {_roles(policy.min_instances)}, max {_roles(policy.max_instances)}, utilisation up > "
          f"{policy.scale_up_utilisation:.0%} / down < {policy.scale_down_utilisation:.0%}, cooldown "
          f"{policy.cooldown_s:g} s, every {policy.interval_s:g} s over {policy.window_s:g} s, start-up "
          f"{args.startup_s:g} s, mode {policy.mode}")
    result = compare_autoscaled(cluster, requests, policy, slo, args.startup_s)
    print(f"  fixed splits: {len(result.fixed)} of the {result.num_splits} within the budget simulated (the rest "
          f"cannot beat them); the autoscaled run starts at the best, {result.best_fixed.label}")
    print(timeline_text(result.decisions, policy.mode))
    print(comparison_text(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        out = {"autoscaled": _split_json(result.autoscaled), "best_fixed": _split_json(result.best_fixed),
               "fixed": [_split_json(r, summary=False) for r in result.fixed],
               "decisions": [asdict(d) for d in result.decisions if d.changed]}
        args.json.write_text(json.dumps(out, indent=2))
    return 0


def _split_json(r, summary: bool = True) -> dict:
    out = {"split": r.label, "attainment": r.attainment, "instance_s": r.instance_s,
           "stopped_overloaded": r.stopped_overloaded}
    if summary:
        out["summary"] = asdict(r.summary)
    return out


def _roles(values: dict) -> str:
    return ", ".join(f"{role} {value}" for role, value in values.items())


