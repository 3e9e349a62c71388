import math

import pytest

from trtpd.planner import queueing as q


def test_mm1():
    # lambda 8, mu 10: rho 0.8, wait 0.8 / (10 - 8) = 0.4 s, sojourn 0.5 s
    assert q.mm1_mean_wait_s(8, 0.1) == pytest.approx(0.4)
    assert q.mm1_mean_sojourn_s(8, 0.1) == pytest.approx(0.5)
    assert q.mm1_sojourn_quantile_s(8, 0.1, 0.9) == pytest.approx(math.log(10) / 2)
    assert q.mm1_mean_wait_s(10, 0.1) == math.inf


def test_md1_is_half_of_mm1():
    assert q.md1_mean_wait_s(8, 0.1) == pytest.approx(q.mm1_mean_wait_s(8, 0.1) / 2)
    assert q.md1_mean_wait_s(5, 0.1) == pytest.approx(0.5 * 0.1 / (2 * 0.5))


def test_pollaczek_khinchine_reduces_to_mm1_and_md1():
    s = 0.1
    assert q.mg1_mean_wait_s(8, s, 2 * s * s) == pytest.approx(q.mm1_mean_wait_s(8, s))   # exponential: E[S^2] = 2 S^2
    assert q.mg1_mean_wait_s(8, s, s * s) == pytest.approx(q.md1_mean_wait_s(8, s))


def test_kingman_reduces_to_mm1_and_md1():
    def kingman(rate, service_s, ca2, cs2):       # G/G/c with one server
        return q.ggc_mean_wait_s(rate, service_s, ca2, cs2, 1)[0]
    assert kingman(8, 0.1, 1.0, 1.0) == pytest.approx(q.mm1_mean_wait_s(8, 0.1))
    assert kingman(8, 0.1, 1.0, 0.0) == pytest.approx(q.md1_mean_wait_s(8, 0.1))
    assert kingman(8, 0.1, 4.0, 0.0) > kingman(8, 0.1, 1.0, 0.0)   # burstier


def test_wait_quantile_is_exact_for_mm1():
    lam, s, p = 8.0, 0.1, 0.95
    t = q.wait_quantile_s(q.mm1_mean_wait_s(lam, s), lam * s, p)
    # M/M/1: P(W > t) = rho exp(-(mu - lambda) t)
    assert 0.8 * math.exp(-(10 - 8) * t) == pytest.approx(1 - p)
    assert q.wait_quantile_s(0.1, 0.05, 0.9) == 0.0      # 95% of requests never wait


def test_poisson_quantile():
    assert q.poisson_quantile(100, 0.5) == pytest.approx(100)
    assert q.poisson_quantile(100, 0.9) == pytest.approx(100 + 1.2816 * 10, rel=1e-4)


def test_erlang_c_known_values():
    assert q.erlang_c(1, 0.7) == pytest.approx(0.7)                 # one server: waits with probability rho
    assert q.erlang_c(2, 1.0) == pytest.approx(1 / 3)               # M/M/2 at rho 0.5 (textbook value)
    # M/M/3, a = 2: B = (8/6) / (1 + 2 + 2 + 8/6) = 4/19; C = B / (1 - (2/3)(15/19)) = 4/9
    assert q.erlang_c(3, 2.0) == pytest.approx(4 / 9)
    assert q.erlang_c(4, 4.0) == 1.0 and q.erlang_c(4, 0.0) == 0.0
    big = q.erlang_c(200, 180.0)                                    # the recursion stays finite for large pools
    assert 0 < big < q.erlang_c(20, 18.0) < 0.9                     # same rho, a larger pool waits less often


def test_ggc_reduces_to_kingman_and_is_exact_for_mmc():
    mean, waits = q.ggc_mean_wait_s(8, 0.1, 1.0, 0.5, 1)     # Kingman: rho / (1 - rho) x (ca2 + cs2) / 2 x S
    assert mean == pytest.approx(0.8 / 0.2 * 0.75 * 0.1) and waits == pytest.approx(0.8)
    # M/M/3 at 2/3 per server, mu 10: Wq = C / (c mu - lambda) = (4/9) / (30 - 20)
    mean, waits = q.ggc_mean_wait_s(20 / 3, 0.1, 1.0, 1.0, 3)
    assert mean == pytest.approx(4 / 9 / 10) and waits == pytest.approx(4 / 9)
    t = q.wait_quantile_s(mean, waits, 0.9)
    assert (4 / 9) * math.exp(-(30 - 20) * t) == pytest.approx(0.1)   # M/M/c: P(W > t) = C exp(-(c mu - lambda) t)
    assert q.ggc_mean_wait_s(10, 0.1, 1.0, 1.0, 4)[0] == math.inf
