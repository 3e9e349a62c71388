"""`trtpd` entry point.

Each command lives in `trtpd/cli/<command>.py` and defines `register(subparsers)`, which adds its
parser and sets `func` to a thin function that calls one library function. Command modules import
only the standard library at top level (heavy modules inside `run`), so `trtpd --help` is instant.
Errors a user can act on (TrtpdError, a bad flag value, an invalid field) are one line, exit status 2.
"""

from __future__ import annotations

import importlib
import os
import sys

from trtpd import __version__
from trtpd.cli.args import Parser, given_dests
from trtpd.errors import TrtpdError

COMMANDS = ("build", "render", "lint", "plan", "simulate", "profile", "up", "down", "status", "scale", "rollout",
            "history", "demo", "bench", "accel")
# commands that only compute, print and write files they have closed: the `trtpd` process ends without the
# interpreter's teardown (70-90 ms after `trtpd plan`: its modules, the simulations' records)
QUICK_EXIT = ("plan", "simulate")


def build_parser(commands: tuple[str, ...] = COMMANDS) -> Parser:
    """The parser of `commands` (all by default; main() builds only the command it runs, so that a command's
    start does not import every other command's module)."""
    parser = Parser(
        prog="trtpd",
        description="Prefill/decode disaggregated LLM serving on TensorRT-LLM 1.2.x and Triton Inference Server.",
    )
    parser.add_argument("--version", action="version", version=f"trtpd {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in commands:
        try:
            module = importlib.import_module(f"trtpd.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"trtpd.cli.{name}":
                continue  # command not available in this build
            raise
        module.register(subparsers)
    parser.set_defaults(command_parsers=subparsers.choices)
    return parser


def _validation_message(exc: Exception) -> str | None:
    """One line for a pydantic ValidationError (without importing pydantic when none was raised)."""
    pydantic = sys.modules.get("pydantic")
    if pydantic is None or not isinstance(exc, pydantic.ValidationError):
        return None
    parts = [f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}" for e in exc.errors()]
    return f"invalid {exc.title}: " + "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser((argv[0],) if argv and argv[0] in COMMANDS else COMMANDS)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    tail = argv[argv.index(args.command) + 1:]
    args.given = given_dests(args.command_parsers[args.command], tail)
    try:
        return int(args.func(args) or 0)
    except TrtpdError as exc:
        print(f"trtpd {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        message = _validation_message(exc)
        if message is None:
            raise
        print(f"trtpd {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `trtpd ... | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def entry() -> None:
    """The `trtpd` console script: main(), then the exit (quick for QUICK_EXIT commands, once output is flushed)."""
    argv = sys.argv[1:]
    code = main(argv)
    if argv and argv[0] in QUICK_EXIT:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except OSError:    # let the interpreter's own exit report it
            sys.exit(code)
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
