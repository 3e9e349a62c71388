"""`trtpd build`: role-tuned prefill and decode engines (TensorRT-LLM 1.2.x, or the CPU reference)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trtpd.trtllm.versions import PINNED
from trtpd.cli import args as a
from trtpd.errors import ConfigError

_INT_FLAGS = ("prefill-tp", "decode-tp", "prefill-pp", "decode-pp", "prefill-max-batch-size",
              "decode-max-batch-size", "prefill-max-num-tokens", "decode-max-num-tokens", "prefill-instances",
              "decode-instances", "max-input-len", "max-output-len", "tokens-per-block", "kv-transfer-timeout-ms")
_TP_LIKE = ("prefill_tp", "decode_tp", "prefill_pp", "decode_pp", "prefill_instances", "decode_instances")
REFERENCE_DEFAULTS = {"tokens_per_block": 32, "max_input_len": 2048, "max_output_len": 512}
TENSORRTLLM_ONLY = ("prefill_max_batch_size", "decode_max_batch_size", "prefill_max_num_tokens",
                    "decode_max_num_tokens", "kv_transfer_timeout_ms", "hf_model", "tokenizer_dir", "trtllm_examples",
                    "gpus_per_node", "gpu_memory_gib", "transport", "container", "http_port", "grpc_port", "metrics_port",
                    "router_port", "first_worker_port", "recipes", "configs_only", "modelopt_dir")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "build", help="build prefill and decode engines, the Triton repository and trtllm-serve configs",
        description=f"Plan and build a prefill-tuned and a decode-tuned engine for TensorRT-LLM {PINNED.tensorrt_llm} "
                    f"(Triton {PINNED.triton_container}), with FP8 KV by default, plus engines/<model>/deploy/ "
                    f"(Triton repository, MPI launch script, trtllm-serve configs for the engines, and "
                    f"serve-pytorch/: the same servers on the PyTorch backend, no engine, which --configs-only "
                    f"writes without a GPU). Defaults and their reasons are in recipes/tensorrtllm/*.yaml.")
    p.add_argument("--model", required=True,
                   help="catalog name (e.g. llama-2-70b) or a Hugging Face checkpoint folder with config.json")
    p.add_argument("--plan", type=Path, default=None, metavar="PLAN.yaml",
                   help="a `trtpd plan` file: TP, instance counts, batch sizes, token budgets, lengths, "
                        "tokens_per_block and the KV dtype come from it (a flag that contradicts it is an error)")
    p.add_argument("--backend", choices=("tensorrtllm", "reference"), default="tensorrtllm",
                   help="tensorrtllm: TensorRT-LLM engines (GPU); reference: the CPU reference engines")
    p.add_argument("--engines-dir", type=Path, default=Path("engines"), help="output root; engines/<model>/")
    for flag in _INT_FLAGS:
        p.add_argument(f"--{flag}", type=a.positive_int, default=None, metavar="N",
                       help=_int_flag_help(flag))
    p.add_argument("--fp8", action=argparse.BooleanOptionalAction, default=None,
                   help="FP8 weights and FP8 KV cache (default on for tensorrtllm, off for reference)")
    p.add_argument("--kv-dtype", choices=("fp16", "bf16", "fp8"), default=None,
                   help="KV dtype; fp8 is --fp8, fp16/bf16 are --no-fp8 with that model dtype "
                        "(default: fp8 for tensorrtllm, as the recipe says; fp16 for reference)")
    p.add_argument("--dtype", choices=("float16", "bfloat16"), default=None,
                   help="dtype of non-quantized weights (default: the recipe's; float16 for reference)")
    p.add_argument("--hf-model", default=None,
                   help="HF id or folder given to quantize.py --model_dir (default: the catalog's HF id, or --model)")
    p.add_argument("--tokenizer-dir", default=None, help="tokenizer for pre/post-processing (default: --hf-model)")
    p.add_argument("--container", default=None, metavar="{auto,triton-26.04,trtllm-1.2.1}",
                   help="the container the build and the deployment run in (each ships TensorRT-LLM 1.2.1 with "
                        "TensorRT 10.14.1.48; docs/containers.md): triton-26.04 "
                        "(nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3, examples in /app/examples; both "
                        "paths) or trtllm-1.2.1 (nvcr.io/nvidia/tensorrt-llm/release:1.2.1, "
                        "/app/tensorrt_llm/examples; no tritonserver, so trtllm-serve only); auto (default) detects "
                        "it from the examples folder, else triton-26.04. An image that ships another TensorRT-LLM "
                        "(e.g. triton-25.12: 1.1.0) is refused with the one to use")
    p.add_argument("--trtllm-examples", default=None,
                   help="TensorRT-LLM examples folder holding quantization/quantize.py (default: the container's)")
    p.add_argument("--modelopt-dir", default=None, metavar="DIR",
                   help="checkout of NVIDIA/Model-Optimizer at tag 0.37.0 (the nvidia-modelopt TensorRT-LLM 1.2.1 "
                        "installs) whose examples/llm_ptq/hf_ptq.py makes deploy/serve-pytorch/'s FP8 checkpoint "
                        "(serve-pytorch/checkpoint.sh; without this flag it reads $MODELOPT_DIR when run). Only with "
                        "FP8 weights: the PyTorch backend serves other checkpoints as they are")
    p.add_argument("--gpus-per-node", type=a.positive_int, default=8, help="GPUs per node")
    p.add_argument("--gpu-memory-gib", type=a.positive_float, default=80.0, help="per GPU; used by tp_size: auto")
    p.add_argument("--transport", choices=("ucx", "nixl"), default=None,
                   help="trtllm-serve KV transport (default: the recipe's)")
    p.add_argument("--http-port", type=a.port, default=8000, help="Triton HTTP port")
    p.add_argument("--grpc-port", type=a.port, default=8001, help="Triton gRPC port")
    p.add_argument("--metrics-port", type=a.port, default=8002, help="Triton metrics port")
    p.add_argument("--router-port", type=a.port, default=8000, help="trtllm-serve disaggregated router")
    p.add_argument("--first-worker-port", type=a.port, default=8100, help="trtllm-serve context/generation servers")
    p.add_argument("--recipes", type=Path, default=None,
                   help="folder with common/prefill/decode.yaml (default: the recipes installed with trtpd)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the exact commands; write nothing")
    mode.add_argument("--configs-only", action="store_true",
                      help="write the deploy folder and planned manifests without building (no GPU needed)")
    p.add_argument("--force", action="store_true", help="rebuild and replace existing output")
    p.set_defaults(func=run)


def _int_flag_help(flag: str) -> str:
    text = "default: the recipe's value" + (" (tp: auto)" if flag.endswith("-tp") else "")
    reference = REFERENCE_DEFAULTS.get(flag.replace("-", "_"))
    return text + (f"; {reference} for reference" if reference else "")


def _resolve_precision(args) -> tuple[bool | None, str | None]:
    fp8, dtype = args.fp8, args.dtype
    if args.kv_dtype:
        wanted = args.kv_dtype == "fp8"
        if fp8 is not None and fp8 != wanted:
            raise ConfigError(f"--kv-dtype {args.kv_dtype} contradicts --{'' if fp8 else 'no-'}fp8; give one of them")
        fp8 = wanted
        if not wanted:
            implied = "bfloat16" if args.kv_dtype == "bf16" else "float16"
            if dtype not in (None, implied):
                raise ConfigError(f"--kv-dtype {args.kv_dtype} contradicts --dtype {dtype}")
            dtype = implied
    return fp8, dtype


def plan_values(plan) -> dict[str, object]:
    """What a plan fixes of a build: per role TP, instances, batch size and token budget; the lengths; the KV."""
    p, d = plan.prefill, plan.decode
    if p is None or d is None:
        raise ConfigError(f"the plan has no configuration to build (feasible: {plan.feasible}, binding "
                          f"constraint: {plan.binding_constraint})")
    max_input = max(p.max_input_len, d.max_input_len)
    return {"prefill_tp": p.tp, "decode_tp": d.tp, "prefill_instances": p.num_instances,
            "decode_instances": d.num_instances, "prefill_max_batch_size": p.max_batch_size,
            "decode_max_batch_size": d.max_batch_size, "prefill_max_num_tokens": p.max_num_tokens,
            "decode_max_num_tokens": d.max_num_tokens, "max_input_len": max_input,
            "max_output_len": d.max_seq_len - max_input, "tokens_per_block": plan.tokens_per_block,
            "kv_dtype": plan.kv_dtype}


def apply_plan(args) -> None:
    """Fills the build's flags from --plan; a flag given on the command line must agree with it."""
    from trtpd.schema.plan import load_plan

    plan = load_plan(args.plan)
    from trtpd.catalog import resolve_model
    if resolve_model(args.model).name != resolve_model(plan.model).name:
        raise ConfigError(f"{args.plan}: the plan is for model {plan.model}, --model is {args.model}")
    given = a.given(args)
    for name, value in plan_values(plan).items():
        current = getattr(args, name)
        if name in given and current != value:
            raise ConfigError(f"--{name.replace('_', '-')} {current} contradicts {args.plan} ({name} {value}); "
                              f"drop the flag or edit the plan")
        setattr(args, name, value)


def run(args) -> int:
    if args.dry_run:
        a.refuse_given(args, ("force",), "a dry run writes nothing, so there is nothing to replace")
    if args.plan is not None:
        apply_plan(args)
    fp8, dtype = _resolve_precision(args)
    if args.backend == "reference":
        return _run_reference(args, fp8, dtype)
    return _run_tensorrtllm(args, fp8, dtype)


def _run_tensorrtllm(args, fp8, dtype) -> int:
    from trtpd.trtllm.containers import choose_container
    from trtpd.trtllm.environment import detect, require_runnable
    from trtpd.trtllm.launch import TritonPorts
    from trtpd.trtllm.recipe import load_recipes
    from trtpd.trtllm.run import prepare, run_build, write_configs
    from trtpd.trtllm.serve_config import ServeLayout
    from trtpd.trtllm.spec import BuildOverrides, make_request

    container = choose_container(args.container or "auto")
    values = {f.replace("-", "_"): getattr(args, f.replace("-", "_")) for f in _INT_FLAGS}
    overrides = BuildOverrides(**values, fp8=fp8, weights_dtype=dtype, transceiver_backend=args.transport)
    request = make_request(args.model, load_recipes(args.recipes), overrides, engines_dir=args.engines_dir.resolve(),
                           hf_model=args.hf_model,
                           examples_dir=args.trtllm_examples or container.examples_dir,
                           gpus_per_node=args.gpus_per_node, gpu_memory_gib=args.gpu_memory_gib,
                           modelopt_dir=args.modelopt_dir)
    prepared = prepare(request, tokenizer_dir=args.tokenizer_dir,
                       triton_ports=TritonPorts(args.http_port, args.grpc_port, args.metrics_port),
                       serve_layout=ServeLayout(router_port=args.router_port, first_worker_port=args.first_worker_port),
                       container=container)
    if args.dry_run:
        print(prepared.text(), end="")
        print("dry run: nothing was written")
        return 0
    if args.configs_only:
        deploy_dir = write_configs(prepared, force=args.force)
        print(prepared.text(), end="")
        print(f"configs written to {deploy_dir}; planned manifests in {request.model_dir}/<role>-tp<N>/ "
              f"(engines not built: run without --configs-only where TensorRT-LLM 1.2.x and GPUs are)")
        return 0
    env = detect()
    require_runnable(env, max(s.gpus_per_instance for s in request.roles))
    print(prepared.text(), flush=True)
    manifests = run_build(prepared, report=lambda line: print(line, flush=True), environment=env, force=args.force)
    for m in manifests:
        print(f"{m.role}: {request.model_dir / m.folder_name} ({m.status})")
    return 0


def _run_reference(args, fp8, dtype) -> int:
    a.refuse_given(args, TENSORRTLLM_ONLY, "only used by --backend tensorrtllm")
    for name in _TP_LIKE:
        value = getattr(args, name)
        if value not in (None, 1):
            raise ConfigError(f"--{name.replace('_', '-')} {value}: the reference backend runs TP1/PP1, one instance; "
                              f"instance counts are set when deploying (trtpd render/up)")
    kv_dtype = "fp8" if fp8 else ("bf16" if dtype == "bfloat16" else "fp16")
    kwargs = {"kv_dtype": kv_dtype, **{k: getattr(args, k) or v for k, v in REFERENCE_DEFAULTS.items()},
              "force": args.force}
    if args.dry_run:
        shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        print(f"would run: build_reference({args.model!r}, {str(args.engines_dir)!r}, {shown})")
        print("dry run: nothing was written")
        return 0
    from trtpd.engine.reference_engines import build_reference

    dirs = build_reference(args.model, args.engines_dir, progress=lambda line: print(line, flush=True), **kwargs)
    for d in dirs:
        print(d)
    _lint_reference(dirs)
    return 0


def _lint_reference(dirs: list[Path]) -> None:
    from trtpd.schema.manifest import load_manifest
    from trtpd.lint import errors, lint_engine_pair, summary

    by_role = {Path(d).name.split("-")[0]: Path(d) for d in dirs}
    if not {"prefill", "decode"} <= set(by_role):
        return
    try:
        prefill, decode = load_manifest(by_role["prefill"]), load_manifest(by_role["decode"])
    except ConfigError as exc:
        print(f"lint skipped: {exc}", file=sys.stderr)
        return
    findings = lint_engine_pair(prefill, decode)
    for f in findings:
        print(f.format(), file=sys.stderr)
    print(summary(findings))
    if errors(findings):
        raise ConfigError("the reference engine pair fails trtpd lint (see above)")
