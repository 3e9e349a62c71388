"""Several real runs of the same grid pooled (trtpd.sim.fidelity.simulate_pooled, pooled_real_against_real;
benchmarks/fidelity_noise.py): each cell's requests of every run taken as one sample, on the real side and on the
simulated side (each run simulated with its own profile)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from trtpd.sim.fidelity import (FidelityRecord, RecordedCell, pool, pooled_real_against_real, shared_cells,
                                simulate_pooled, simulate_record, simulated_cells)

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "fidelity"


def _record(ttft_s: list[float], arrivals: list[float] | None = None) -> FidelityRecord:
    n = len(ttft_s)
    cell = RecordedCell("cpu-demo", 2.0, "colocated", arrivals or [i * 0.5 for i in range(n)], [100] * n, [50] * n,
                        list(ttft_s), [0.005] * n, [True] * n)
    return FidelityRecord("vm", "2026-12-05", "tiny-llama", "", {}, 1.0, 0.04, 0, [cell])


def test_pooled_runs_are_one_sample_of_all_their_requests():
    """Two runs of ten requests whose P90s read 55 and 120 ms: pooled, the P90 is that of all twenty, 100 ms (not
    the runs' P90s averaged); a group against itself is exact, and against a group whose requests all took 0.1 s
    longer it reads that difference."""
    first = _record([0.05] * 9 + [0.1])
    second = _record([0.1] * 9 + [0.3])
    assert [np.quantile(r.cells[0].real().ttft_s, 0.9) for r in (first, second)] == pytest.approx([0.055, 0.12])
    together = pool([first.cells[0].real(), second.cells[0].real()])
    assert len(together.ttft_s) == 20 and together.done.all()
    assert np.quantile(together.ttft_s, 0.9) == pytest.approx(0.1)
    rows = {r.name: r for r in pooled_real_against_real([first, second], [first, second])["cpu-demo"]}
    assert all(r.error == 0.0 for r in rows.values())
    slower = [_record([t + 0.1 for t in r.cells[0].real_ttft_s]) for r in (first, second)]
    rows = {r.name: r for r in pooled_real_against_real([first, second], slower)["cpu-demo"]}
    assert (rows["TTFT P50"].real, rows["TTFT P50"].sim) == pytest.approx((100.0, 200.0))
    assert (rows["TTFT P90"].real, rows["TTFT P90"].sim) == pytest.approx((100.0, 200.0))
    assert rows["TPOT P50"].error == 0.0


def test_only_cells_every_run_measured_with_the_same_requests_are_pooled():
    same, other = _record([0.05] * 10), _record([0.05] * 10, arrivals=[i * 0.4 for i in range(10)])
    assert shared_cells([same, same]) == same.cells
    assert shared_cells([same, other]) == [] and shared_cells([other, same, same]) == []
    assert pooled_real_against_real([same], [other]) == {}


def test_one_run_pooled_is_that_run_and_each_run_is_simulated_with_its_own_profile():
    """The recorded run alone pooled gives what simulate_record gives; pooled with the 14:30 run (the same seed,
    so the same requests, another profile), each cell's simulated side is both runs' simulated requests, each run
    on the profile it measured, and its real side both runs' real requests."""
    record = FidelityRecord.load(GOLDEN / "record.json")
    earlier = FidelityRecord.load(GOLDEN / "record-2026-12-05-1430.json")
    assert simulate_pooled([record]) == simulate_record(record)

    cells = shared_cells([record, earlier])
    assert cells, "the two recorded runs share no cell: re-record them with the same seed"
    pooled = simulate_pooled([record, earlier])
    first = cells[0]
    key = (first.workload, first.rate_per_s, first.mode)
    real, simulated = [], []
    for run in (record, earlier):
        for cell, sim in simulated_cells(run):
            if (cell.workload, cell.rate_per_s, cell.mode) == key:
                real.append(cell.real().ttft_s)
                simulated.append(sim.ttft_s)
    row = pooled[first.workload][0]   # the workload's first cell's TTFT P50
    assert row.name == "TTFT P50" and len(real) == len(simulated) == 2
    assert row.real == pytest.approx(np.nanquantile(np.concatenate(real), 0.5) * 1e3)
    assert row.sim == pytest.approx(np.nanquantile(np.concatenate(simulated), 0.5) * 1e3)
    # both runs simulated on the recorded profile give other figures: the 14:30 run's own profile counts
    one_profile = dataclasses.replace(earlier, hardware_yaml=record.hardware_yaml)
    assert simulate_pooled([record, one_profile]) != pooled
