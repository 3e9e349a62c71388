"""Queueing formulas the planner uses (rates in requests/s, times in s).

M/M/1: mean wait rho / (mu - lambda), sojourn ~ Exp(mu - lambda).
M/D/1: mean wait rho S / (2 (1 - rho)).
M/G/1 (Pollaczek-Khinchine): mean wait lambda E[S^2] / (2 (1 - rho)).
G/G/1 (Kingman): mean wait ~ rho / (1 - rho) x (ca^2 + cs^2) / 2 x E[S].
G/G/c (Allen-Cunneen): mean wait ~ C(c, a) / (c mu - lambda) x (ca^2 + cs^2) / 2, with C(c, a) Erlang C's
probability that an arrival waits (a = lambda / mu offered load; c = 1: C = rho, Kingman's formula).
Tail: P(W > t) ~ C exp(-C t / E[W]) (exact for M/M/c), so the p-quantile of the wait is
E[W] / C x ln(C / (1 - p)) when C > 1 - p, else 0.
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


def erlang_c(num_servers: int, offered_load: float) -> float:
    """The probability that an arrival waits in M/M/c (offered load a = lambda / mu, in servers);
    1 when a >= c. Erlang B by its recursion (stable for any c), then C = B / (1 - rho (1 - B))."""
    if offered_load >= num_servers:
        return 1.0
    if offered_load <= 0:
        return 0.0
    b = 1.0
    for k in range(1, num_servers + 1):
        b = offered_load * b / (k + offered_load * b)
    rho = offered_load / num_servers
    return b / (1 - rho * (1 - b))


def ggc_mean_wait_s(rate_per_server_s: float, mean_service_s: float, arrival_cv2: float, service_cv2: float,
                    num_servers: int) -> tuple[float, float]:
    """(mean wait, probability of waiting) of c servers fed from one queue at rate_per_server_s each
    (Allen-Cunneen); c = 1 is Kingman's formula with P(wait) = rho."""
    rho = rate_per_server_s * mean_service_s
    if rho >= 1:
        return math.inf, 1.0
    waits = erlang_c(num_servers, rho * num_servers) if num_servers > 1 else rho
    return waits / (1 - rho) / num_servers * (arrival_cv2 + service_cv2) / 2 * mean_service_s, waits


def wait_quantile_s(mean_wait_s: float, prob_wait: float, p: float) -> float:
    """The p-quantile of the wait, given its mean and the probability of waiting at all (rho for one server)."""
    if prob_wait >= 1 or math.isinf(mean_wait_s):
        return math.inf
    if prob_wait <= 1 - p or mean_wait_s <= 0:
        return 0.0
    return mean_wait_s / prob_wait * math.log(prob_wait / (1 - p))


def normal_quantile(p: float) -> float:
    return NormalDist().inv_cdf(p)


def poisson_quantile(mean: float, p: float) -> float:
    """Normal approximation of a Poisson quantile (the number of sequences in an M/G/inf decode pool)."""
    return mean + normal_quantile(p) * math.sqrt(mean) if mean > 0 else 0.0
