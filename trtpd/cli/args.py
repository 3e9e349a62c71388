"""Argument parsing for every command: one-line errors, defaults shown in --help, values checked on entry.

Only the standard library is imported here: `trtpd --help` must not pay for torch, numpy or pydantic.
"""

from __future__ import annotations

import argparse
import re
from typing import Callable, Iterable

from trtpd.errors import ConfigError

# Implausible latency targets: a value above these is almost surely given in milliseconds.
MAX_TTFT_S = 600.0
MAX_TPOT_S = 10.0


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" to every option whose help does not state its default already."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or not action.option_strings:
            return text
        if action.default in (None, False, argparse.SUPPRESS):
            return text
        return f"{text} (default: %(default)s)".strip()


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (`trtpd plan: error: --attainment 90: ...`), exit status 2."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {one_line(message)}\n")


_INVALID_TYPE = re.compile(r"^argument (\S+): invalid (\w+) value: '(.*)'$", re.S)
_INVALID_CHOICE = re.compile(r"^argument (\S+): invalid choice: '(.*?)' \((.*)\)$", re.S)
_ARGUMENT = re.compile(r"^argument (\S+): (.*)$", re.S)
_KINDS = {"int": "an integer", "float": "a number"}


def one_line(message: str) -> str:
    """argparse's messages, flag first: `--seed abc: expected an integer`."""
    if m := _INVALID_TYPE.match(message):
        return f"{m[1]} {m[3]}: expected {_KINDS.get(m[2], m[2])}"
    if m := _INVALID_CHOICE.match(message):
        return f"{m[1]} {m[2]}: invalid choice ({m[3]})"
    if m := _ARGUMENT.match(message):
        return f"{m[1]} {m[2]}"
    return " ".join(message.split())


def _number(text: str, kind: type) -> float | int:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text}: expected {_KINDS[kind.__name__]}") from None


def _checked(kind: type, ok: Callable[[float], bool], rule: str, name: str) -> Callable[[str], float | int]:
    def parse(text: str):
        value = _number(text, kind)
        if not ok(value):
            raise argparse.ArgumentTypeError(f"{text}: {rule}")
        return value
    parse.__name__ = name
    return parse


positive_int = _checked(int, lambda v: v > 0, "must be a positive integer", "positive_int")
nonnegative_int = _checked(int, lambda v: v >= 0, "must be an integer >= 0", "nonnegative_int")
positive_float = _checked(float, lambda v: v > 0, "must be a positive number", "positive_float")
nonnegative_float = _checked(float, lambda v: v >= 0, "must be a number >= 0", "nonnegative_float")
port = _checked(int, lambda v: 1 <= v <= 65535, "must be a TCP port in 1..65535", "port")
fraction = _checked(float, lambda v: 0 < v < 1, "must be a fraction in (0, 1), e.g. 0.9", "fraction")


def latency_s(what: str, max_s: float) -> Callable[[str], float]:
    """A latency target in seconds; refuses values that only make sense in milliseconds."""
    def parse(text: str) -> float:
        value = positive_float(text)
        if value > max_s:
            raise argparse.ArgumentTypeError(
                f"{text}: a {what} of {value:g} s is implausible (the value is in seconds, at most {max_s:g}); "
                f"did you mean {value / 1000:g}?")
        return value
    parse.__name__ = f"{what.lower()}_s"
    return parse


ttft_s = latency_s("TTFT", MAX_TTFT_S)
tpot_s = latency_s("TPOT", MAX_TPOT_S)


def positive_int_list(text: str) -> list[int]:
    """Comma-separated positive integers: `1,2,4,8`."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated positive integers, e.g. 1,2,4,8")
    try:
        values = [int(x) for x in items]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text}: expected comma-separated integers, e.g. 1,2,4,8") from None
    if min(values) <= 0:
        raise argparse.ArgumentTypeError(f"{text}: every value must be a positive integer")
    return values


def flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def given(args: argparse.Namespace) -> frozenset[str]:
    """The dests the user gave on the command line (set by main); empty when run() is called directly."""
    return getattr(args, "given", frozenset())


def refuse_given(args: argparse.Namespace, dests: Iterable[str], reason: str) -> None:
    """Refuse flags that the chosen mode would ignore: `--input-tokens: <reason>`."""
    bad = [d for d in dests if d in given(args)]
    if bad:
        raise ConfigError(f"{', '.join(flag(d) for d in bad)}: {reason}")


def given_dests(parser: argparse.ArgumentParser, argv: list[str]) -> frozenset[str]:
    """Parse argv again with every default suppressed: what remains was given explicitly."""
    saved = [(a, a.default) for a in parser._actions]
    try:
        for action, _ in saved:
            action.default = argparse.SUPPRESS
        namespace, _ = parser.parse_known_args(argv)
    finally:
        for action, default in saved:
            action.default = default
    # a suppressed default can still come back through `type` (an empty optional positional): str(v) tells
    return frozenset(k for k, v in vars(namespace).items() if str(v) != argparse.SUPPRESS)
