"""Options shared by commands that deploy the reference backend."""

from __future__ import annotations

import argparse
from pathlib import Path

from trtpd.cli import args as a


def add_reference_args(p: argparse.ArgumentParser, mode_default: str = "disaggregated") -> None:
    g = p.add_argument_group("reference deployment")
    g.add_argument("--mode", choices=("disaggregated", "colocated"), default=mode_default,
                   help="prefill and decode on separate instances, or one model doing both (default: %(default)s)")
    g.add_argument("--engines", type=Path, default=None,
                   help="reference build folder (default: <engines-dir>/<model>/reference-<kv-dtype>)")
    g.add_argument("--model", default="tiny-llama", help="catalog model (default: %(default)s)")
    g.add_argument("--kv-dtype", default="fp16", choices=("fp16", "bf16", "fp8"), help="KV cache dtype of the build")
    g.add_argument("--engines-dir", type=Path, default=Path("engines"), help="where `trtpd build` put the engines")
    g.add_argument("--kv-transport", choices=("shm", "tcp", "ucx", "mpi"), default="shm",
                   help="KV transfer between prefill and decode (default: %(default)s)")
    g.add_argument("--prefill-instances", type=a.positive_int, default=1, help="disaggregated: prefill instances")
    g.add_argument("--decode-instances", type=a.positive_int, default=1, help="disaggregated: decode instances")
    g.add_argument("--colocated-instances", type=a.positive_int, default=2,
                   help="colocated model instances (default: %(default)s, one per core of a 2-core machine, "
                        "the same cores as 1 prefill + 1 decode)")


def reference_spec(args: argparse.Namespace, mode: str | None = None):
    from trtpd.deploy.spec import ReferenceDeployment
    from trtpd.repo.reference import default_build_root

    mode = mode or args.mode
    if mode == "colocated":
        a.refuse_given(args, ("prefill_instances", "decode_instances"), "not used by --mode colocated "
                                                                        "(give --colocated-instances)")
    else:
        a.refuse_given(args, ("colocated_instances",), f"not used by --mode {mode}")
    root = args.engines or default_build_root(args.engines_dir, args.model, args.kv_dtype)
    return ReferenceDeployment(build_root=Path(root), mode=mode, kv_transport=args.kv_transport,
                               prefill_instances=args.prefill_instances, decode_instances=args.decode_instances,
                               colocated_instances=args.colocated_instances)


def print_curves_origin(hardware, model_name: str, kv_dtype: str | None = None) -> None:
    """Which machine the simulator's curves come from (trtpd plan and simulate say it under their summary); with
    `kv_dtype`, only curves measured at it count (the perf model looks them up by model, TP and KV dtype)."""
    from trtpd.perf.hardware import curves_origin
    origin = curves_origin(hardware, model_name, kv_dtype)
    if origin is None:
        other = sorted({p.kv_dtype for p in hardware.measured if p.model == model_name})
        why = (f"{hardware.name} has curves for {model_name} at {', '.join(other)} KV only, not {kv_dtype}: "
               f"--kv-dtype {other[0]} uses them" if other else
               f"{hardware.name} has no measured curves for {model_name}")
        origin = f"roofline estimate ({why})"
    print(f"  curves: {origin}")
