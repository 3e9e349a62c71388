"""Queueing formulas the planner uses (rates in requests/s, times in s).

M/M/1: mean wait rho / (mu - lambda), sojourn ~ Exp(mu - lambda).
M/D/1: mean wait rho S / (2 (1 - rho)).
M/G/1 (Pollaczek-Khinchine): mean wait lambda E[S^2] / (2 (1 - rho)).
G/G/1 (Kingman): mean wait ~ rho / (1 - rho) x (ca^2 + cs^2) / 2 x E[S].
Tail: P(W > t) ~ rho exp(-rho t / E[W]) (exact for M/M/1), so the p-quantile of the wait is
E[W] / rho x ln(rho / (1 - p)) when rho > 1 - p, else 0.
"""

from __future__ import annotations

import math
from statistics import NormalDist


def utilization(rate_per_s: float, service_s: float) -> float:
    return rate_per_s * service_s


def mm1_mean_wait_s(rate_per_s: float, service_s: float) -> float:
    mu = 1.0 / service_s
    if rate_per_s >= mu:
        return math.inf
    return rate_per_s / (mu * (mu - rate_per_s))


def mm1_mean_sojourn_s(rate_per_s: float, service_s: float) -> float:
    mu = 1.0 / service_s
    return math.inf if rate_per_s >= mu else 1.0 / (mu - rate_per_s)


def mm1_sojourn_quantile_s(rate_per_s: float, service_s: float, p: float) -> float:
    mu = 1.0 / service_s
    return math.inf if rate_per_s >= mu else -math.log(1.0 - p) / (mu - rate_per_s)


def md1_mean_wait_s(rate_per_s: float, service_s: float) -> float:
    rho = rate_per_s * service_s
    return math.inf if rho >= 1 else rho * service_s / (2 * (1 - rho))


def mg1_mean_wait_s(rate_per_s: float, mean_service_s: float, second_moment_s2: float) -> float:
    rho = rate_per_s * mean_service_s
    return math.inf if rho >= 1 else rate_per_s * second_moment_s2 / (2 * (1 - rho))


def kingman_mean_wait_s(rate_per_s: float, mean_service_s: float, arrival_cv2: float, service_cv2: float) -> float:
    rho = rate_per_s * mean_service_s
    if rho >= 1:
        return math.inf
    return rho / (1 - rho) * (arrival_cv2 + service_cv2) / 2 * mean_service_s


def wait_quantile_s(mean_wait_s: float, rho: float, p: float) -> float:
    if rho >= 1 or math.isinf(mean_wait_s):
        return math.inf
    if rho <= 1 - p or mean_wait_s <= 0:
        return 0.0
    return mean_wait_s / rho * math.log(rho / (1 - p))


def normal_quantile(p: float) -> float:
    return NormalDist().inv_cdf(p)


def poisson_quantile(mean: float, p: float) -> float:
    """Normal approximation of a Poisson quantile (the number of sequences in an M/G/inf decode pool)."""
    return mean + normal_quantile(p) * math.sqrt(mean) if mean > 0 else 0.0
