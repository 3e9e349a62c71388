"""Deterministic instance order: by name, numbers compared as numbers (prefill-2 before prefill-10)."""

from __future__ import annotations

import re

_DIGITS = re.compile(r"(\d+)")


def name_order_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """'prefill-10' -> ((1, 'prefill-'), (0, 10), (1, '')): digit runs sort numerically, before text."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in _DIGITS.split(name))
