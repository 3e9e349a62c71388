import pytest

from trtpd.perf.interp import Curve1D, Grid2D


def test_curve_interpolates_linearly_between_points():
    c = Curve1D((100, 200, 400), (1.0, 2.0, 3.0))
    assert c(150) == pytest.approx(1.5)
    assert c(300) == pytest.approx(2.5)
    assert c(200) == pytest.approx(2.0)


def test_curve_holds_below_and_extends_above():
    c = Curve1D((100, 200), (1.0, 3.0))
    assert c(10) == 1.0                      # never faster than the smallest measurement
    assert c(300) == pytest.approx(5.0)      # last segment extended: slope 2 per 100


def test_curve_single_point_is_constant():
    c = Curve1D((64,), (0.25,))
    assert c(1) == c(64) == c(10_000) == 0.25


def test_curve_extrapolation_never_negative():
    c = Curve1D((1, 2), (2.0, 1.0))
    assert c(10) == 0.0


@pytest.mark.parametrize("xs,ys", [((2, 1), (1.0, 2.0)), ((1, 1), (1.0, 1.0)), ((1, 2), (1.0,)), ((), ())])
def test_curve_rejects_bad_axes(xs, ys):
    with pytest.raises(ValueError):
        Curve1D(xs, ys)


def _plane(x, y):
    return 1.0 + 0.5 * x + 0.25 * y + 0.01 * x * y    # bilinear: reproduced exactly


def test_grid_is_exact_for_bilinear_functions():
    xs, ys = (1, 8, 32), (128, 512, 2048)
    g = Grid2D(xs, ys, tuple(tuple(_plane(x, y) for y in ys) for x in xs))
    for x, y in [(1, 128), (4, 300), (20, 1000), (32, 2048), (8, 512)]:
        assert g(x, y) == pytest.approx(_plane(x, y))


def test_grid_holds_below_and_extends_above():
    xs, ys = (1, 2), (10, 20)
    g = Grid2D(xs, ys, tuple(tuple(_plane(x, y) for y in ys) for x in xs))
    assert g(0, 5) == pytest.approx(_plane(1, 10))
    assert g(3, 20) == pytest.approx(_plane(3, 20))          # linear in x beyond the grid, exact here
    assert g(2, 30) == pytest.approx(_plane(2, 30))


def test_grid_rejects_wrong_shape():
    with pytest.raises(ValueError):
        Grid2D((1, 2), (1, 2), ((1.0, 2.0),))
