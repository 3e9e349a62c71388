"""`trtpd plan`: how many prefill and decode instances (and which TP) meet the SLOs."""

from __future__ import annotations

import argparse
from pathlib import Path

from trtpd.cli import args as a
from trtpd.errors import ConfigError

SEED004_DEFAULTS = {"input_tokens": 6144, "output_tokens": 512, "tp_prefill_max": 28300, "overhead_s": 0.1,
                    "decode_batch": 34, "decode_tpot_s": 0.020}
SEED004_ONLY = ("tp_prefill_max", "overhead_s", "tp_prefill_tokens_per_s", "decode_batch", "decode_tpot_s")
SEARCH_ONLY = ("model", "hardware", "workload", "tpot_s", "attainment", "rate_per_s", "max_gpus", "tp_prefill",
               "tp_decode", "weight_dtype", "kv_dtype", "kv_link", "first_token_at", "no_verify", "verify_requests",
               "no_colocated",
               "seed", "output", "yaml")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="capacity plan: prefill/decode instance counts and TP that meet the SLOs",
                       description="Search TP per role and instance counts for a target rate (or the highest rate "
                                   "within a GPU budget), verify the plan in the simulator, print it and write "
                                   "the plan YAML. --method seed004 reproduces seed 004's calculation.")
    p.add_argument("--method", choices=("search", "seed004"), default="search", help="planning method")
    p.add_argument("--model", default="llama-2-70b", help="catalog name or HF checkpoint folder")
    p.add_argument("--hardware", default="h100-sxm", help="configs/hardware name or YAML path")
    p.add_argument("--workload", default="chat-powerlaw", help="configs/workloads name or YAML path")
    p.add_argument("--slo", default=None, help="configs/slo name or YAML path (default: chat)")
    p.add_argument("--ttft-s", type=a.ttft_s, help="override the SLO's TTFT target, seconds")
    p.add_argument("--tpot-s", type=a.tpot_s, help="override the SLO's TPOT target, seconds")
    p.add_argument("--attainment", type=a.fraction, help="override the share of requests that must meet both")
    rate = p.add_mutually_exclusive_group()
    rate.add_argument("--rate-per-s", type=a.positive_float, help="target requests/s")
    rate.add_argument("--tokens-per-min", type=a.positive_float, help="target input+output tokens per minute")
    p.add_argument("--max-gpus", type=a.positive_int, help="GPU budget")
    p.add_argument("--tp-prefill", type=a.positive_int_list, default=[1, 2, 4, 8],
                   help="TP degrees to try (default: 1,2,4,8)")
    p.add_argument("--tp-decode", type=a.positive_int_list, default=[1, 2, 4, 8],
                   help="TP degrees to try (default: 1,2,4,8)")
    p.add_argument("--weight-dtype", choices=("fp32", "fp16", "bf16", "fp8"),
                   help="weight dtype (default: fp8, or the hardware profile's own when it has no fp8 figure)")
    p.add_argument("--kv-dtype", choices=("fp16", "bf16", "fp8"),
                   help="KV cache dtype (default: fp8, or the KV dtype of the hardware profile's measured curves "
                        "for the model when it has none at fp8)")
    p.add_argument("--kv-link", default="auto", choices=("auto", "nvlink", "network"),
                   help="auto: NVLink when the plan fits in one node, else the network")
    p.add_argument("--first-token-at", default="decode", choices=("prefill", "decode"),
                   help="decode: the client's first token leaves the decode instance (Triton BLS); "
                        "prefill: it leaves the prefill instance")
    p.add_argument("--no-verify", action="store_true", help="skip the simulator check")
    p.add_argument("--no-colocated", action="store_true",
                   help="skip the colocated search (by default the best colocated configuration is simulated "
                        "beside the disaggregated one and the better one recommended)")
    p.add_argument("--verify-requests", type=a.positive_int, default=6000, help="requests per verification run")
    p.add_argument("--seed", type=int, default=0, help="random seed of the verification run")
    p.add_argument("-o", "--output", type=Path, help="write the plan YAML here")
    p.add_argument("--yaml", action="store_true", help="print the plan YAML instead of the summary")
    p.add_argument("--input-tokens", type=a.positive_int,
                   help="fixed prompt length for every request (default: the workload's lengths; "
                        f"--method seed004: {SEED004_DEFAULTS['input_tokens']})")
    p.add_argument("--output-tokens", type=a.positive_int,
                   help="fixed output length for every request (default: the workload's lengths; "
                        f"--method seed004: {SEED004_DEFAULTS['output_tokens']})")
    s = p.add_argument_group("--method seed004 only (seed 004's numbers as inputs)")
    s.add_argument("--tp-prefill-max", type=a.positive_float,
                   help=f"measured max prefill tokens/s (default: {SEED004_DEFAULTS['tp_prefill_max']})")
    s.add_argument("--overhead-s", type=a.nonnegative_float,
                   help=f"T_overhead in the TTFT equation (default: {SEED004_DEFAULTS['overhead_s']})")
    s.add_argument("--tp-prefill-tokens-per-s", type=a.positive_float,
                   help="use this usable prefill throughput instead of the formula's (the seed rounds to 25000)")
    s.add_argument("--decode-batch", type=a.positive_int,
                   help=f"largest batch meeting the TPOT target (default: {SEED004_DEFAULTS['decode_batch']})")
    s.add_argument("--decode-tpot-s", type=a.tpot_s,
                   help=f"TPOT measured at that batch (default: {SEED004_DEFAULTS['decode_tpot_s']})")
    p.set_defaults(func=run)


def _slo(args: argparse.Namespace):
    from trtpd.planner.inputs import Slo, load_slo

    base = load_slo(args.slo or "chat")
    update = {k: v for k, v in (("ttft_s", args.ttft_s), ("tpot_s", args.tpot_s),
                                ("attainment", args.attainment)) if v is not None}
    return Slo.model_validate({**base.model_dump(), **update})


def _workload(args: argparse.Namespace):
    """The workload, with --input-tokens / --output-tokens replacing its length distributions."""
    from trtpd.sim.lengths import FixedLengths
    from trtpd.sim.workload import load_workload

    workload = load_workload(args.workload)
    fixed = {k: getattr(args, k) for k in ("input_tokens", "output_tokens") if getattr(args, k) is not None}
    if not fixed:
        return workload
    if workload.trace is not None:
        raise ConfigError(f"{', '.join(a.flag(k) for k in fixed)}: workload {workload.name!r} replays a trace, "
                          f"whose lengths cannot be overridden; pick a workload with length distributions")
    lengths = {k: FixedLengths(kind="fixed", tokens=v) for k, v in fixed.items()}
    label = ", ".join(f"{k.split('_')[0]} {v}" for k, v in fixed.items())
    return workload.model_copy(update={**lengths, "name": f"{workload.name} (fixed {label} tokens)"})


def run(args: argparse.Namespace) -> int:
    if args.method == "seed004":
        return run_seed004(args)
    a.refuse_given(args, SEED004_ONLY, "only used by --method seed004")
    from trtpd.catalog import resolve_model
    from trtpd.perf.hardware import load_hardware
    from trtpd.planner.inputs import SearchSpace, Target
    from trtpd.planner.make import VerifyOptions, make_plan
    from trtpd.planner.report import plan_text
    from trtpd.planner.search import PlanProblem

    target = None
    if args.rate_per_s or args.tokens_per_min:
        target = Target(rate_per_s=args.rate_per_s, tokens_per_min=args.tokens_per_min)
    elif not args.max_gpus:
        raise ConfigError("give --rate-per-s or --tokens-per-min (a target), or --max-gpus (a budget)")
    hardware, model = load_hardware(args.hardware), resolve_model(args.model)
    space = SearchSpace(tp_prefill=args.tp_prefill, tp_decode=args.tp_decode,
                        weight_dtype=args.weight_dtype or hardware.default_weight_dtype("fp8"),
                        kv_dtype=args.kv_dtype or hardware.default_kv_dtype(model.name, "fp8"),
                        kv_link=args.kv_link, first_token_at=args.first_token_at, max_gpus=args.max_gpus)
    problem = PlanProblem(model, hardware, _workload(args), _slo(args), target, space)
    plan = make_plan(problem, VerifyOptions(enabled=not args.no_verify, num_requests=args.verify_requests,
                                            seed=args.seed, compare_colocated=not args.no_colocated))
    print(plan.to_yaml() if args.yaml else plan_text(plan))
    if not args.yaml:
        from trtpd.cli.common import print_curves_origin
        print_curves_origin(hardware, problem.model.name, space.kv_dtype)
    if args.output:
        plan.save(args.output)
        if not args.yaml:
            print(f"wrote {args.output}")
    return 0 if plan.feasible else 3


def run_seed004(args: argparse.Namespace) -> int:
    a.refuse_given(args, SEARCH_ONLY, "not used by --method seed004 (it takes --slo/--ttft-s, --tokens-per-min, "
                                      "--input-tokens, --output-tokens and the seed004 group)")
    from trtpd.planner import throughput_ratio
    from trtpd.planner.inputs import load_slo
    from trtpd.planner.report import seed004_text

    v = {k: getattr(args, k) if getattr(args, k) is not None else d for k, d in SEED004_DEFAULTS.items()}
    slo = _slo(args) if (args.slo or args.ttft_s) else load_slo("seed004")     # TTFT 2 s, TPOT 20 ms
    if not args.tokens_per_min:
        raise ConfigError("--method seed004 needs --tokens-per-min (seed 004 states its target that way)")
    formula = throughput_ratio.prefill_throughput_under_ttft(v["tp_prefill_max"], v["input_tokens"], slo.ttft_s,
                                                    v["overhead_s"])
    tp_prefill = args.tp_prefill_tokens_per_s or formula
    print(f"TP_prefill = {v['tp_prefill_max']:.0f} - {v['input_tokens']:.0f} / ({slo.ttft_s:g} - {v['overhead_s']:g})"
          f" = {formula:.1f} tokens/s" + (f"; using {tp_prefill:.0f}" if args.tp_prefill_tokens_per_s else ""))
    tp_decode = throughput_ratio.decode_throughput(v["decode_batch"], v["decode_tpot_s"])
    counts = throughput_ratio.instance_counts(args.tokens_per_min / 60, v["input_tokens"], v["output_tokens"],
                                     tp_prefill, tp_decode)
    ratio = throughput_ratio.pd_ratio(v["input_tokens"], v["output_tokens"], tp_prefill, tp_decode)
    print(seed004_text(counts, v["input_tokens"], v["output_tokens"], tp_prefill, tp_decode, ratio))
    return 0
