"""Check every flag and key trtpd emits against the TensorRT-LLM 1.2.x options table."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from trtpd.trtllm.options_table import TrtllmOption, options_for
from trtpd.errors import ConfigError


def check_value(option: TrtllmOption, value: object) -> str | None:
    """Returns a problem with `value` for `option`, or None when it is acceptable."""
    where = f"{option.tool} {option.name}"
    if option.deprecated:
        return f"{where} must not be emitted: {option.deprecated}"
    if option.type == "flag":
        return None if value is None else f"{where} takes no value, got {value!r}"
    if value is None:
        return f"{where} needs a value"
    if option.type == "list":
        return None if isinstance(value, (list, tuple)) else f"{where} must be a list, got {value!r}"
    text = _as_text(value)
    if option.empty_ok and text == "":
        return None
    if option.type in ("int", "float"):
        try:
            number = int(text) if option.type == "int" else float(text)
        except ValueError:
            return f"{where} must be an {option.type}, got {text!r}"
        if option.min_value is not None and number < option.min_value:
            return f"{where} must be >= {option.min_value:g}, got {text}"
        if option.max_value is not None and number > option.max_value:
            return f"{where} must be <= {_number(option.max_value)}, got {text}"
        return None
    if option.type == "memsize":     # TensorRT-LLM's parseMemorySize (envUtils.cpp): a number, then a unit
        if re.fullmatch(r"\d+(\.\d+)?(b|kb|mb|gb|tb)", text.strip().lower()) is None:
            return f"{where} must be a size such as 512MB (b, kb, mb, gb, tb); got {text!r}"
        return None
    if option.allowed is not None and text not in option.allowed:
        return f"{where} must be one of {', '.join(option.allowed)}; got {text!r}"
    if not text:
        return f"{where} must not be empty"
    return None


def check_args(tool: str, args: Sequence[tuple[str, object]]) -> list[str]:
    """Problems with (flag, value) pairs for `tool`: unknown, deprecated, mistyped or repeated flags."""
    table = options_for(tool)
    if not table:
        return [f"no options table for tool {tool!r}"]
    problems, seen = [], set()
    repeatable = {"--load-model", "-x", "-n"}
    for flag, value in args:
        option = table.get(flag)
        if option is None:
            problems.append(f"{tool}: {flag} is not a TensorRT-LLM 1.2.x option trtpd knows "
                            f"(see trtpd/trtllm/options_table.py)")
            continue
        if flag in seen and flag not in repeatable:
            problems.append(f"{tool}: {flag} given twice")
        seen.add(flag)
        problem = check_value(option, value)
        if problem:
            problems.append(problem)
    return problems


def check_keys(tool: str, values: Mapping[str, object]) -> list[str]:
    """Problems with a nested mapping (YAML) or flat parameters (config.pbtxt) for `tool`."""
    table = options_for(tool)
    problems = []
    for key, value in flatten(values).items():
        option = table.get(key)
        if option is None:
            problems.append(f"{tool}: key {key!r} is not a TensorRT-LLM 1.2.x key trtpd knows "
                            f"(see trtpd/trtllm/options_table.py)")
            continue
        problem = check_value(option, value)
        if problem:
            problems.append(problem)
    return problems


def require_valid(problems: list[str], what: str) -> None:
    if problems:
        raise ConfigError(f"{what}: " + "; ".join(problems))


def flatten(values: Mapping[str, object], prefix: str = "") -> dict[str, object]:
    flat: dict[str, object] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, prefix=f"{name}."))
        else:
            flat[name] = value
    return flat


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _as_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
