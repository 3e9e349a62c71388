"""The one percentile definition (trtpd.percentiles): numpy's linear interpolation, used live and in simulation."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from trtpd.percentiles import percentiles, quantile


def test_quantile_interpolates_between_the_closest_ranks():
    values = [5, 1, 4, 2, 3]
    assert quantile(values, 0.9) == pytest.approx(4.6)    # nearest rank (the rollout gate's before) said 5
    assert quantile(values, 0.5) == 3.0 and quantile(values, 0.0) == 1.0 and quantile(values, 1.0) == 5.0
    assert quantile(values, 0.9) == pytest.approx(statistics.quantiles(values, n=10, method="inclusive")[8])
    assert quantile(values, 0.9) == float(np.quantile(values, 0.9))


def test_none_and_nan_are_left_out_inf_stays_and_empty_is_none():
    assert quantile([None, 1.0, float("nan"), 3.0], 0.5) == 2.0
    assert quantile([], 0.9) is None and quantile([None, float("nan")], 0.9) is None
    assert quantile([1.0, math.inf, 3.0, 2.0], 1 / 3) == 2.0    # inf is a value (an unfinished request's TTFT)
    with pytest.raises(ValueError, match="share in"):
        quantile([1.0], 90)                                   # a percentile, not a share: refused


def test_summary_percentiles_are_the_same_function():
    x = np.arange(1, 101, dtype=float)
    p = percentiles(x)
    assert (p.p50, p.p90, p.p99) == (quantile(x, 0.5), quantile(x, 0.9), quantile(x, 0.99))
    assert p.mean == 50.5 and math.isnan(percentiles([]).p90)
