"""Strict `${placeholder}` templates.

Unlike TensorRT-LLM's fill_template.py (string.Template.safe_substitute, which leaves unknown
placeholders in place for the C++ side to misread), an unfilled placeholder is an error, and so is
a value that no placeholder uses (a typo in a key). `$$` is a literal dollar sign.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from trtpd.errors import ConfigError

_PLACEHOLDER = re.compile(r"\$(?:\$|\{([A-Za-z_][A-Za-z0-9_]*)\}|(.?))")


def placeholders(text: str) -> set[str]:
    names = set()
    for match in _PLACEHOLDER.finditer(text):
        if match.group(0) == "$$":
            continue
        if match.group(1) is None:
            raise ConfigError(f"malformed placeholder near {match.group(0)!r}; write ${{name}} or $$ for a dollar sign")
        names.add(match.group(1))
    return names


def render(text: str, values: Mapping[str, object], source: str) -> str:
    """Fills every `${name}`; raises ConfigError naming `source` for unfilled or unused keys."""
    try:
        needed = placeholders(text)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    missing = sorted(needed - set(values))
    if missing:
        raise ConfigError(f"{source}: no value for placeholder(s) {', '.join('${' + m + '}' for m in missing)}")
    unused = sorted(set(values) - needed)
    if unused:
        raise ConfigError(f"{source}: value(s) given for {', '.join(unused)} but the template has no such placeholder")

    def fill(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        value = values[match.group(1)]
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)

    return _PLACEHOLDER.sub(fill, text)
