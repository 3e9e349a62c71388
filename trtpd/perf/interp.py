"""Piecewise-linear interpolation over measured points (1-D) and grids (2-D, bilinear).

Inside the measured range the value is interpolated. Below the smallest point the value is held
(a smaller batch is never assumed faster than the smallest one measured). Above the largest point
the last segment is extended linearly (prefill and decode costs keep growing with size).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Sequence


def _check_axis(name: str, xs: Sequence[float]) -> None:
    if len(xs) == 0:
        raise ValueError(f"{name}: needs at least one point")
    if any(b <= a for a, b in zip(xs, xs[1:])):
        raise ValueError(f"{name}: points must be strictly increasing, got {list(xs)}")


@dataclass(frozen=True)
class Curve1D:
    xs: tuple[float, ...]
    ys: tuple[float, ...]

    def __post_init__(self) -> None:
        _check_axis("x", self.xs)
        if len(self.xs) != len(self.ys):
            raise ValueError(f"{len(self.xs)} x values but {len(self.ys)} y values")

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if x <= xs[0] or len(xs) == 1:
            return ys[0] if x <= xs[0] else ys[-1]
        i = bisect.bisect_left(xs, x)
        if i >= len(xs):
            i = len(xs) - 1  # extrapolate with the last segment
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


@dataclass(frozen=True)
class Grid2D:
    """values[i][j] at (xs[i], ys[j])."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]
    values: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        _check_axis("rows", self.xs)
        _check_axis("columns", self.ys)
        if len(self.values) != len(self.xs) or any(len(row) != len(self.ys) for row in self.values):
            raise ValueError(f"grid must be {len(self.xs)} rows x {len(self.ys)} columns")

    def __call__(self, x: float, y: float) -> float:
        i0, i1, tx = _bracket(self.xs, x)
        j0, j1, ty = _bracket(self.ys, y)
        v = self.values
        top = v[i0][j0] + (v[i0][j1] - v[i0][j0]) * ty
        bottom = v[i1][j0] + (v[i1][j1] - v[i1][j0]) * ty
        return max(0.0, top + (bottom - top) * tx)


def _bracket(axis: Sequence[float], x: float) -> tuple[int, int, float]:
    """Indices of the two points around x and the weight of the second (held below, extended above)."""
    n = len(axis)
    if n == 1 or x <= axis[0]:
        return 0, 0, 0.0
    i = bisect.bisect_left(axis, x)
    if i >= n:
        i = n - 1
    return i - 1, i, (x - axis[i - 1]) / (axis[i] - axis[i - 1])
