"""`trtpd` entry point.

Each command lives in `trtpd/cli/<command>.py` and defines `register(subparsers)`, which adds its
parser and sets `func` to a thin function that calls one library function. Errors that a user can
act on (TrtpdError) are printed without a traceback and exit with status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from trtpd import __version__
from trtpd.errors import TrtpdError

COMMANDS = ("build", "render", "lint", "plan", "simulate", "profile", "up", "down", "status", "demo", "bench")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trtpd",
        description="Prefill/decode disaggregated LLM serving on TensorRT-LLM 1.2.x and Triton Inference Server.",
    )
    parser.add_argument("--version", action="version", version=f"trtpd {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"trtpd.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"trtpd.cli.{name}":
                continue  # command not available in this build
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    try:
        return int(args.func(args) or 0)
    except TrtpdError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
