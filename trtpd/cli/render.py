"""`trtpd render`: a Triton model repository for the reference backend, linted before it is written."""

from __future__ import annotations

import argparse
from pathlib import Path

from trtpd.cli import args as a
from trtpd.cli.common import add_reference_args, reference_spec
from trtpd.errors import ConfigError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("render", help="render a Triton model repository",
                       description="Render triton_models/ templates into a Triton model repository that wires "
                                   "preprocessing -> disagg_bls -> prefill/decode (or colocated) -> postprocessing. "
                                   "Placeholders are filled strictly; every config.pbtxt is parsed as ModelConfig; "
                                   "the prefill/decode pair and the repository are linted. For TensorRT-LLM engines "
                                   "the repository comes with `trtpd build --configs-only`.")
    p.add_argument("--backend", choices=("reference", "tensorrtllm"), default="reference",
                   help="tensorrtllm repositories come with `trtpd build --configs-only`")
    p.add_argument("--output", "-o", type=Path, required=True, help="repository folder to write")
    p.add_argument("--force", action="store_true", help="replace an existing repository")
    p.add_argument("--kv-transfer-timeout-ms", type=a.positive_int, default=30000,
                   help="prefill frees KV that decode has not pulled by then (default: %(default)s)")
    p.add_argument("--skip-compat-check", action="store_true",
                   help="render even if prefill and decode cannot exchange KV (for tests of the runtime check)")
    add_reference_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.backend == "tensorrtllm":
        raise ConfigError("the tensorrtllm repository is written with its engines' plan: run "
                          "`trtpd build --model <model> --configs-only` (it lands in engines/<model>/deploy/)")
    from dataclasses import replace

    from trtpd.repo.reference import render_reference_repository

    spec = replace(reference_spec(args), kv_transfer_timeout_ms=args.kv_transfer_timeout_ms)
    out = render_reference_repository(spec, args.output, overwrite=args.force,
                                      check_compatibility=not args.skip_compat_check)
    print(f"rendered {spec.mode} repository: {out}")
    for model in sorted(p.name for p in out.iterdir() if (p / "config.pbtxt").is_file()):
        print(f"  {model}")
    return 0
