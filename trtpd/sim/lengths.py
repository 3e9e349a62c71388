"""Token-length distributions: fixed, uniform, power-law (seed 000), quantiles (a published length
table: piecewise-linear between (share, tokens) points) and an empirical trace column.

Power law: seed 000 describes prompt lengths as "power-law, mean 512, P99 2,048". A Pareto type I
distribution (x_min, alpha) matches both numbers exactly: mean = alpha x_min / (alpha - 1) and
P99 = x_min x 100^(1/alpha), so 2048 / 512 = 4 = 100^(1/alpha) (alpha - 1) / alpha gives alpha = 2.387
and x_min = 297.5. (A Lomax, which starts at 0, cannot reach a P99/mean ratio below ln 100 = 4.6.)
Lengths are rounded to whole tokens and capped at max_tokens when one is given.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from trtpd.errors import ConfigError
from trtpd.percentiles import SUMMARY_QUANTILES, quantile

STATS_SAMPLES = 50_000


@dataclass(frozen=True)
class LengthStats:
    mean: float
    mean_sq: float
    p50: float
    p90: float
    p99: float
    max: float

    def quantile(self, p: float) -> float:
        """Piecewise-linear between the stored quantiles (p in [0.5, 1])."""
        points = [(0.5, self.p50), (0.9, self.p90), (0.99, self.p99), (1.0, self.max)]
        if p <= 0.5:
            return self.p50
        for (p0, q0), (p1, q1) in zip(points, points[1:]):
            if p <= p1:
                return q0 + (q1 - q0) * (p - p0) / (p1 - p0)
        return self.max


def stats_of(samples: np.ndarray) -> LengthStats:
    x = samples.astype(np.float64)
    p50, p90, p99 = (quantile(x, q) for q in SUMMARY_QUANTILES)
    return LengthStats(float(x.mean()), float((x * x).mean()), float(p50), float(p90), float(p99), float(x.max()))


class _Lengths(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        raise NotImplementedError

    def stats(self) -> LengthStats:
        return stats_of(self.sample(np.random.default_rng(12345), STATS_SAMPLES))


class FixedLengths(_Lengths):
    kind: Literal["fixed"]
    tokens: int = Field(gt=0)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.tokens, dtype=np.int64)

    def stats(self) -> LengthStats:
        t = float(self.tokens)
        return LengthStats(t, t * t, t, t, t, t)


class UniformLengths(_Lengths):
    kind: Literal["uniform"]
    min_tokens: int = Field(gt=0)
    max_tokens: int = Field(gt=0)

    @model_validator(mode="after")
    def _check(self) -> "UniformLengths":
        if self.max_tokens < self.min_tokens:
            raise ValueError(f"max_tokens ({self.max_tokens}) must be >= min_tokens ({self.min_tokens})")
        return self

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self.min_tokens, self.max_tokens + 1, size=n, dtype=np.int64)


def pareto_alpha_for(mean: float, p99: float) -> float:
    """Solves 100^(1/a) (a - 1) / a = p99 / mean for the Pareto shape a (bisection)."""
    ratio = p99 / mean
    if not 1.0 < ratio < 100.0:
        raise ConfigError(f"power_law: p99_tokens / mean_tokens = {ratio:.2f}; it must be between 1 and 100")
    lo, hi = 1.0 + 1e-9, 1e6
    for _ in range(200):
        mid = (lo + hi) / 2
        if 100 ** (1 / mid) * (mid - 1) / mid > ratio:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


class PowerLawLengths(_Lengths):
    kind: Literal["power_law"]
    mean_tokens: float = Field(default=512, gt=0)
    p99_tokens: float = Field(default=2048, gt=0)
    max_tokens: int | None = Field(default=None, gt=0)

    @property
    def alpha(self) -> float:
        return pareto_alpha_for(self.mean_tokens, self.p99_tokens)

    @property
    def x_min(self) -> float:
        a = self.alpha
        return self.mean_tokens * (a - 1) / a

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        a, xm = self.alpha, self.x_min
        u = 1.0 - rng.random(n)  # (0, 1]
        x = np.rint(xm * u ** (-1.0 / a)).astype(np.int64)
        np.maximum(x, 1, out=x)
        if self.max_tokens is not None:
            np.minimum(x, self.max_tokens, out=x)
        return x


class QuantileLengths(_Lengths):
    """Piecewise-linear inverse CDF through published quantiles: points [[0, min], [0.5, median], ...,
    [1, max]] (shares from 0 to 1, tokens non-decreasing)."""

    kind: Literal["quantiles"]
    points: list[tuple[float, float]] = Field(min_length=2)

    @model_validator(mode="after")
    def _check(self) -> "QuantileLengths":
        shares = [q for q, _ in self.points]
        tokens = [t for _, t in self.points]
        if shares[0] != 0.0 or shares[-1] != 1.0 or any(b <= a for a, b in zip(shares, shares[1:])):
            raise ValueError(f"quantiles: shares must rise strictly from 0 to 1, got {shares}")
        if tokens[0] < 1 or any(b < a for a, b in zip(tokens, tokens[1:])):
            raise ValueError(f"quantiles: tokens must be >= 1 and non-decreasing, got {tokens}")
        return self

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        shares = np.array([q for q, _ in self.points])
        tokens = np.array([t for _, t in self.points], dtype=float)
        return np.maximum(1, np.rint(np.interp(rng.random(n), shares, tokens))).astype(np.int64)


class TraceLengths(_Lengths):
    """Resamples one column of a trace file (CSV with a header, or JSON lines)."""

    kind: Literal["trace"]
    path: Path
    column: str

    def values(self) -> np.ndarray:
        return np.asarray(read_trace_column(self.path, self.column), dtype=np.int64)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        values = self.values()
        return values[rng.integers(0, len(values), size=n)]

    def stats(self) -> LengthStats:
        return stats_of(self.values())


LengthDistribution = Annotated[Union[FixedLengths, UniformLengths, PowerLawLengths, QuantileLengths, TraceLengths],
                               Field(discriminator="kind")]


def read_trace_rows(path: Path) -> list[dict]:
    if not path.is_file():
        raise ConfigError(f"{path}: trace file not found")
    text = path.read_text()
    if path.suffix in (".jsonl", ".json"):
        try:
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: not JSON lines ({exc})") from None
    return list(csv.DictReader(text.splitlines()))


def read_trace_column(path: Path, column: str) -> list[float]:
    rows = read_trace_rows(path)
    if not rows:
        raise ConfigError(f"{path}: trace has no rows")
    if column not in rows[0]:
        raise ConfigError(f"{path}: no column {column!r} (columns: {', '.join(rows[0])})")
    values = []
    for i, row in enumerate(rows, start=1):
        try:
            value = float(row[column])
        except (TypeError, ValueError):
            raise ConfigError(f"{path}: row {i}, column {column!r}: {row[column]!r} is not a number") from None
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"{path}: row {i}, column {column!r}: {value} must be finite and >= 0")
        values.append(value)
    return values
