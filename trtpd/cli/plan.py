"""`trtpd plan`: how many prefill and decode instances (and which TP) meet the SLOs."""

from __future__ import annotations

import argparse
from pathlib import Path

from trtpd.catalog import resolve_model
from trtpd.errors import ConfigError
from trtpd.perf.hardware import load_hardware
from trtpd.planner import seed004
from trtpd.planner.inputs import SearchSpace, Slo, Target, load_slo
from trtpd.planner.make import VerifyOptions, make_plan
from trtpd.planner.report import plan_text, seed004_text
from trtpd.planner.search import PlanProblem
from trtpd.sim.workload import load_workload


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="capacity plan: prefill/decode instance counts and TP that meet the SLOs",
                       description="Search TP per role and instance counts for a target rate (or the highest rate "
                                   "within a GPU budget), verify the plan in the simulator, print it and write "
                                   "the plan YAML. --method seed004 reproduces seed 004's calculation.")
    p.add_argument("--method", choices=("search", "seed004"), default="search")
    p.add_argument("--model", default="llama-2-70b", help="catalog name or HF checkpoint folder (default: %(default)s)")
    p.add_argument("--hardware", default="h100-sxm", help="configs/hardware name or YAML path (default: %(default)s)")
    p.add_argument("--workload", default="chat-powerlaw", help="configs/workloads name or YAML path")
    p.add_argument("--slo", default=None, help="configs/slo name or YAML path (default: chat)")
    p.add_argument("--ttft-s", type=float, help="override the SLO's TTFT target")
    p.add_argument("--tpot-s", type=float, help="override the SLO's TPOT target")
    p.add_argument("--attainment", type=float, help="override the share of requests that must meet both")
    rate = p.add_mutually_exclusive_group()
    rate.add_argument("--rate-per-s", type=float, help="target requests/s")
    rate.add_argument("--tokens-per-min", type=float, help="target input+output tokens per minute")
    p.add_argument("--max-gpus", type=int, help="GPU budget")
    p.add_argument("--tp-prefill", type=_int_list, default=[1, 2, 4, 8], help="TP degrees to try (default: 1,2,4,8)")
    p.add_argument("--tp-decode", type=_int_list, default=[1, 2, 4, 8], help="TP degrees to try (default: 1,2,4,8)")
    p.add_argument("--weight-dtype", default="fp8", choices=("fp32", "fp16", "bf16", "fp8"))
    p.add_argument("--kv-dtype", default="fp8", choices=("fp16", "bf16", "fp8"))
    p.add_argument("--kv-link", default="auto", choices=("auto", "nvlink", "network"),
                   help="auto: NVLink when the plan fits in one node, else the network")
    p.add_argument("--first-token-at", default="decode", choices=("prefill", "decode"),
                   help="decode: the client's first token leaves the decode instance (Triton BLS); "
                        "prefill: it leaves the prefill instance")
    p.add_argument("--no-verify", action="store_true", help="skip the simulator check")
    p.add_argument("--verify-requests", type=int, default=6000, help="requests per verification run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-o", "--output", type=Path, help="write the plan YAML here")
    p.add_argument("--yaml", action="store_true", help="print the plan YAML instead of the summary")
    s = p.add_argument_group("--method seed004 (seed 004's numbers as inputs)")
    s.add_argument("--input-tokens", type=float, default=6144)
    s.add_argument("--output-tokens", type=float, default=512)
    s.add_argument("--tp-prefill-max", type=float, default=28300, help="measured max prefill tokens/s")
    s.add_argument("--overhead-s", type=float, default=0.1, help="T_overhead in the TTFT equation")
    s.add_argument("--tp-prefill-tokens-per-s", type=float,
                   help="use this usable prefill throughput instead of the formula's (the seed rounds to 25000)")
    s.add_argument("--decode-batch", type=int, default=34, help="largest batch meeting the TPOT target")
    s.add_argument("--decode-tpot-s", type=float, default=0.020, help="TPOT measured at that batch")
    p.set_defaults(func=run)


def _slo(args: argparse.Namespace) -> Slo:
    base = load_slo(args.slo or "chat")
    update = {k: v for k, v in (("ttft_s", args.ttft_s), ("tpot_s", args.tpot_s),
                                ("attainment", args.attainment)) if v is not None}
    return Slo.model_validate({**base.model_dump(), **update})


def run(args: argparse.Namespace) -> int:
    if args.method == "seed004":
        return run_seed004(args)
    target = None
    if args.rate_per_s or args.tokens_per_min:
        target = Target(rate_per_s=args.rate_per_s, tokens_per_min=args.tokens_per_min)
    elif not args.max_gpus:
        raise ConfigError("give --rate-per-s or --tokens-per-min (a target), or --max-gpus (a budget)")
    space = SearchSpace(tp_prefill=args.tp_prefill, tp_decode=args.tp_decode, weight_dtype=args.weight_dtype,
                        kv_dtype=args.kv_dtype, kv_link=args.kv_link, first_token_at=args.first_token_at,
                        max_gpus=args.max_gpus)
    problem = PlanProblem(resolve_model(args.model), load_hardware(args.hardware), load_workload(args.workload),
                          _slo(args), target, space)
    plan = make_plan(problem, VerifyOptions(enabled=not args.no_verify, num_requests=args.verify_requests,
                                            seed=args.seed))
    print(plan.to_yaml() if args.yaml else plan_text(plan))
    if args.output:
        plan.save(args.output)
        if not args.yaml:
            print(f"wrote {args.output}")
    return 0 if plan.feasible else 3


def run_seed004(args: argparse.Namespace) -> int:
    slo = _slo(args) if (args.slo or args.ttft_s) else Slo(ttft_s=2.0, tpot_s=0.020)
    if not args.tokens_per_min:
        raise ConfigError("--method seed004 needs --tokens-per-min (seed 004 states its target that way)")
    formula = seed004.prefill_throughput_under_ttft(args.tp_prefill_max, args.input_tokens, slo.ttft_s,
                                                    args.overhead_s)
    tp_prefill = args.tp_prefill_tokens_per_s or formula
    print(f"TP_prefill = {args.tp_prefill_max:.0f} - {args.input_tokens:.0f} / ({slo.ttft_s:g} - {args.overhead_s:g})"
          f" = {formula:.1f} tokens/s" + (f"; using {tp_prefill:.0f}" if args.tp_prefill_tokens_per_s else ""))
    tp_decode = seed004.decode_throughput(args.decode_batch, args.decode_tpot_s)
    counts = seed004.instance_counts(args.tokens_per_min / 60, args.input_tokens, args.output_tokens,
                                     tp_prefill, tp_decode)
    ratio = seed004.pd_ratio(args.input_tokens, args.output_tokens, tp_prefill, tp_decode)
    print(seed004_text(counts, args.input_tokens, args.output_tokens, tp_prefill, tp_decode, ratio))
    return 0
