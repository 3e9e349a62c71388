"""`trtpd profile`: measure an engine's prefill and decode curves and write them into a hardware profile."""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

from trtpd.cli import args as a
from trtpd.errors import ConfigError

DEFAULT_OUTPUT = Path("cpu-reference.yaml")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="measure prefill/decode latency curves into a hardware profile",
                       description="Measure the engine's prefill latency vs batched tokens and decode step latency "
                                   "vs batch size and context length, and write them into a hardware profile "
                                   "(--output, default ./cpu-reference.yaml in the current directory; the profiles "
                                   "installed with trtpd are never changed) that `trtpd plan --hardware PATH` and "
                                   "`trtpd simulate --hardware PATH` then use instead of the roofline.")
    p.add_argument("--backend", choices=("reference",), default="reference", help="engine backend")
    p.add_argument("--from", dest="source", choices=("engine", "aiconfigurator"), default="engine",
                   help="engine: measure a built engine (--engine-dir); aiconfigurator: build the curves from "
                        "AIConfigurator's measured per-operator database (--model, --tp, --system, --aic-db)")
    p.add_argument("--engine-dir", type=Path,
                   help="a reference build folder (with prefill-tp1/ and decode-tp1/) or one role's engine folder")
    g = p.add_argument_group("--from aiconfigurator")
    g.add_argument("--model", help="catalog name (dense GQA/MHA models; DeepSeek-V3/V3.1: MLA + MoE at EP = TP)")
    g.add_argument("--tp", type=a.positive_int, default=1, help="tensor parallelism of the instance")
    g.add_argument("--system", help="AIConfigurator system name (h100_sxm, h200_sxm, a100_sxm, b200_sxm, ...)")
    g.add_argument("--framework", default="trtllm", help="AIConfigurator framework tables (default: trtllm)")
    g.add_argument("--framework-version", help="framework version (default: the newest in the database)")
    g.add_argument("--weight-dtype", default="fp8", choices=("fp8", "fp16", "bf16"), help="GEMM dtype")
    g.add_argument("--kv-dtype", default="fp8", choices=("fp8", "fp16", "bf16"), help="KV cache dtype")
    g.add_argument("--aic-db", type=Path, help="AIConfigurator's database: its aiconfigurator_core folder or "
                                               "systems/data (default: the installed aiconfigurator-core; "
                                               "without it or pyarrow here, .venv-aic's, exported to CSV "
                                               "through it: TRTPD_SETUP_AIC=1 scripts/setup.sh)")
    g.add_argument("--hardware", help="hardware profile to start from when --output does not exist "
                                      "(default: the installed one matching --system)")
    p.add_argument("--output", type=Path, default=DEFAULT_OUTPUT,
                   help="hardware profile to write or update; when it does not exist, it starts from the installed "
                        "cpu-reference profile (default: %(default)s, in the current directory)")
    p.add_argument("--repeats", type=a.positive_int, default=3,
                   help="measurements per point (their median), one in each pass over the whole grid")
    p.add_argument("--quick", action="store_true", help="a coarse grid (for a smoke test)")
    p.add_argument("--serving", action="store_true",
                   help="also measure the serving overhead through the real tritonserver, disaggregated and "
                        "colocated (about a minute and a half): the request path, the decode step's costs from the "
                        "engines' traced steps, the CPU the serving path takes per token from the cores the engines "
                        "share, and what a step costs beside another engine's")
    p.set_defaults(func=run)


def _engine_folders(engine_dir: Path) -> tuple[Path, Path]:
    if (engine_dir / "config.json").is_file():
        return engine_dir, engine_dir
    prefill, decode = engine_dir / "prefill-tp1", engine_dir / "decode-tp1"
    if not (prefill / "config.json").is_file() or not (decode / "config.json").is_file():
        raise ConfigError(f"{engine_dir}: neither an engine folder (config.json) nor a build folder with "
                          f"prefill-tp1/ and decode-tp1/; build one with `trtpd build --backend reference`")
    return prefill, decode


AIC_SYSTEMS = {"h100_sxm": "h100-sxm", "h200_sxm": "h200", "a100_sxm": "a100-80g"}


def run_aiconfigurator(args: argparse.Namespace) -> int:
    from trtpd.catalog import resolve_model
    import tempfile

    from trtpd.perf.aiconfigurator import AicSystem, profile_from_aiconfigurator, readable_database
    from trtpd.perf.hardware import load_hardware, save_hardware
    from trtpd.perf.profiling import with_measured

    if not args.model or not args.system:
        raise ConfigError("--from aiconfigurator needs --model and --system (e.g. --system h100_sxm)")
    if args.engine_dir:
        raise ConfigError("--engine-dir: not used with --from aiconfigurator")
    with tempfile.TemporaryDirectory(prefix="trtpd-aic-") as scratch:    # CSV export when .venv lacks pyarrow
        root = readable_database(args.aic_db, args.system, args.framework, Path(scratch))
        system = AicSystem(root, args.system, args.framework, args.framework_version)
        measured = profile_from_aiconfigurator(
            system, resolve_model(args.model), args.tp, args.weight_dtype, args.kv_dtype,
            measured_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    if args.output.is_file():
        hardware = load_hardware(str(args.output))
    else:
        base = args.hardware or AIC_SYSTEMS.get(args.system)
        if base is None:
            raise ConfigError(f"--system {args.system}: no installed hardware profile matches; pass --hardware")
        hardware = load_hardware(base)
    hardware = hardware.model_copy(update={"measured": with_measured(hardware.measured, measured)})
    save_hardware(hardware, args.output)
    print(f"wrote {args.output}: {measured.model} TP{measured.tp} {measured.kv_dtype} KV from {measured.backend} "
          f"({len(measured.prefill.num_tokens)} prefill points, {len(measured.decode.batch_sizes)} x "
          f"{len(measured.decode.context_lens)} decode grid)")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.source == "aiconfigurator":
        return run_aiconfigurator(args)
    if not args.engine_dir:
        raise ConfigError("--engine-dir is required (or --from aiconfigurator)")
    from trtpd.engine.engine_config import EngineConfig

    from trtpd.engine import profiling
    from trtpd.perf.hardware import load_hardware, save_hardware, this_host
    from trtpd.perf.profiling import EngineLimits, ProfileGrid, measure_profile, with_measured

    prefill_dir, decode_dir = _engine_folders(args.engine_dir)
    pcfg, dcfg = EngineConfig.load(prefill_dir), EngineConfig.load(decode_dir)
    limits = EngineLimits(prefill_max_num_tokens=pcfg.max_num_tokens, decode_max_batch_size=dcfg.max_batch_size,
                          decode_max_seq_len=dcfg.max_seq_len,
                          decode_kv_capacity_tokens=dcfg.num_kv_blocks * dcfg.tokens_per_block,
                          prefill_max_input_len=pcfg.max_input_len)
    grid = ProfileGrid.quick() if args.quick else ProfileGrid()
    print(f"profiling {pcfg.model} ({pcfg.kv_dtype.value} KV) on {this_host()}: "
          f"prefill from {prefill_dir}, decode from {decode_dir}", flush=True)
    measured = measure_profile(
        lambda lens: profiling.measure_prefill_s(prefill_dir, lens, repeats=1),
        lambda batch, ctx: profiling.measure_decode_step_s(decode_dir, batch, ctx, repeats=1),
        grid, limits, model=pcfg.model, kv_dtype=pcfg.kv_dtype.value, tp=pcfg.tp_size, backend=args.backend,
        measured_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        host=this_host(),
        progress=lambda line: print(f"  {line}", flush=True), passes=args.repeats)
    hardware = load_hardware(str(args.output)) if args.output.is_file() else load_hardware("cpu-reference")
    hardware = hardware.model_copy(update={"measured": with_measured(hardware.measured, measured)})
    if args.serving:
        from trtpd.bench.serving_probe import measure_serving_overhead

        build_root = prefill_dir.parent
        serving = {mode: measure_serving_overhead(build_root, hardware, mode, progress=lambda l: print(f"  {l}", flush=True))
                   for mode in ("disaggregated", "colocated")}
        measured = measured.model_copy(update={"serving": serving})
        hardware = hardware.model_copy(update={"measured": with_measured(hardware.measured, measured)})
    save_hardware(hardware, args.output)
    print(f"wrote {args.output} ({len(measured.prefill.num_tokens)} prefill points, "
          f"{len(measured.decode.batch_sizes)} x {len(measured.decode.context_lens)} decode grid)")
    return 0
