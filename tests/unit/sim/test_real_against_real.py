"""trtpd.sim.fidelity.real_against_real: two real runs of the same requests held against each other
(benchmarks/fidelity_noise.py), the floor under any simulator's error against one run."""

import math

import pytest

from trtpd.sim.fidelity import FidelityRecord, RecordedCell, mape, real_against_real


def _record(ttft_scale: float = 1.0, arrivals: list[float] | None = None) -> FidelityRecord:
    n = 10
    cell = RecordedCell("cpu-demo", 2.0, "colocated", arrivals or [i * 0.5 for i in range(n)], [100] * n, [50] * n,
                        [ttft_scale * (0.05 + 0.01 * i) for i in range(n)], [0.005 + 0.0005 * i for i in range(n)],
                        [True] * n)
    return FidelityRecord("vm", "2026-12-05", "tiny-llama", "", {}, 1.0, 0.04, 0, [cell])


def test_the_same_run_against_itself_is_exact_and_a_slower_one_reads_its_difference():
    assert mape(real_against_real(_record(), _record())["cpu-demo"]) == 0.0
    rows = {r.name: r for r in real_against_real(_record(), _record(ttft_scale=1.2))["cpu-demo"]}
    assert rows["TTFT P50"].error == pytest.approx(0.2) and rows["TTFT P90"].error == pytest.approx(0.2)
    assert rows["TPOT P50"].error == 0.0 and rows["goodput/s"].error == 0.0
    assert not math.isnan(mape(list(rows.values())))


def test_cells_of_other_requests_are_not_compared():
    assert real_against_real(_record(), _record(arrivals=[i * 0.4 for i in range(10)])) == {}
