import numpy as np
import pytest

from trtpd.errors import ConfigError
from trtpd.sim.lengths import FixedLengths, PowerLawLengths, TraceLengths, UniformLengths, pareto_alpha_for


def test_power_law_parameters_match_seed_000():
    # 100^(1/a) (a - 1) / a = 2048 / 512 = 4  ->  a = 2.387, x_min = 512 (a - 1) / a = 297.5
    d = PowerLawLengths(kind="power_law", mean_tokens=512, p99_tokens=2048)
    assert d.alpha == pytest.approx(2.3872, abs=1e-4)
    assert d.x_min == pytest.approx(297.52, abs=0.01)
    assert d.x_min * 100 ** (1 / d.alpha) == pytest.approx(2048)


def test_power_law_samples_have_the_stated_mean_and_p99():
    d = PowerLawLengths(kind="power_law", mean_tokens=512, p99_tokens=2048)
    x = d.sample(np.random.default_rng(0), 400_000)
    assert np.quantile(x, 0.99) == pytest.approx(2048, rel=0.02)
    assert x.mean() == pytest.approx(512, rel=0.02)
    assert x.min() >= 297


def test_power_law_cap():
    d = PowerLawLengths(kind="power_law", max_tokens=1000)
    assert d.sample(np.random.default_rng(1), 10_000).max() == 1000
    assert d.stats().max == 1000


def test_impossible_power_law_is_refused():
    with pytest.raises(ConfigError, match="p99_tokens / mean_tokens"):
        pareto_alpha_for(512, 400)


def test_fixed_and_uniform():
    assert FixedLengths(kind="fixed", tokens=7).stats().p99 == 7
    u = UniformLengths(kind="uniform", min_tokens=10, max_tokens=20).sample(np.random.default_rng(0), 10_000)
    assert u.min() == 10 and u.max() == 20
    with pytest.raises(ValueError):
        UniformLengths(kind="uniform", min_tokens=20, max_tokens=10)


def test_trace_column(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("input_tokens,output_tokens\n100,5\n300,7\n")
    d = TraceLengths(kind="trace", path=path, column="input_tokens")
    assert set(d.sample(np.random.default_rng(0), 100)) == {100, 300}
    with pytest.raises(ConfigError, match="no column 'prompt'"):
        TraceLengths(kind="trace", path=path, column="prompt").sample(np.random.default_rng(0), 1)
    bad = tmp_path / "bad.csv"
    bad.write_text("input_tokens\nlots\n")
    with pytest.raises(ConfigError, match="row 1"):
        TraceLengths(kind="trace", path=bad, column="input_tokens").sample(np.random.default_rng(0), 1)


def test_quantile_lengths_follow_the_published_table():
    from trtpd.sim.lengths import QuantileLengths
    q = QuantileLengths(kind="quantiles", points=[(0, 10), (0.5, 100), (0.9, 500), (1, 1000)])
    s = q.stats()
    assert s.p50 == pytest.approx(100, rel=0.03) and s.p90 == pytest.approx(500, rel=0.03) and s.max <= 1000
    # mean of the piecewise-linear inverse CDF: 0.5 x 55 + 0.4 x 300 + 0.1 x 750 = 222.5
    assert s.mean == pytest.approx(222.5, rel=0.02)
    with pytest.raises(ValueError, match="shares"):
        QuantileLengths(kind="quantiles", points=[(0.1, 10), (1, 100)])
