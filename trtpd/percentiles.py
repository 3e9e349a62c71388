"""The one percentile definition of trtpd: numpy's default, linear interpolation between the closest ranks
(Hyndman & Fan's type 7; Python's `statistics.quantiles(method="inclusive")` gives the same). The simulator's
summaries, the planner's verification, the length statistics, the gateway's per-request samples, the rollout
gate and the autoscaler's observations all use it, so a P90 means the same number live and in simulation.

`q` is a share in [0, 1] (an SLO's attainment is one: attainment 0.9 judges the P90). None and NaN values are
left out; infinities stay (the planner counts an unfinished request as an infinite TTFT).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

SUMMARY_QUANTILES = (0.5, 0.9, 0.99)


def _finite_or_inf(values: Iterable[float | None] | np.ndarray) -> np.ndarray:
    if isinstance(values, np.ndarray) and values.dtype.kind == "f":
        x = values.ravel()
    else:
        x = np.asarray([v for v in values if v is not None], dtype=float)
    return x[~np.isnan(x)]


def quantile(values: Iterable[float | None] | np.ndarray, q: float) -> float | None:
    """The `q` quantile (0 <= q <= 1) of `values`; None when there is none."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q}: expected a share in [0, 1] (0.9 for a P90)")
    x = _finite_or_inf(values)
    return float(np.quantile(x, q)) if len(x) else None


@dataclass(frozen=True)
class Percentiles:
    mean: float
    p50: float
    p90: float
    p99: float

    def at(self, percentile: float) -> float:
        return {50: self.p50, 90: self.p90, 99: self.p99}.get(percentile, self.p90)

    def as_dict(self) -> dict[str, float]:
        return {"mean": self.mean, "p50": self.p50, "p90": self.p90, "p99": self.p99}


def percentiles(values: Iterable[float | None] | np.ndarray) -> Percentiles:
    """Mean, P50, P90, P99 of `values` (None and NaN left out); all NaN when nothing is left."""
    x = _finite_or_inf(values)
    if not len(x):
        return Percentiles(float("nan"), float("nan"), float("nan"), float("nan"))
    p50, p90, p99 = (float(np.quantile(x, q)) for q in SUMMARY_QUANTILES)
    return Percentiles(float(x.mean()), p50, p90, p99)
