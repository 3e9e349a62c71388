"""Several real runs of the same grid pooled (trtpd.sim.fidelity.simulate_pooled, pooled_real_against_real;
benchmarks/fidelity_noise.py): each cell's requests of every run taken as one sample, on the real side and on the
simulated side (each run simulated with its own profile)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from trtpd.sim.fidelity import (FidelityRecord, RecordedCell, beyond_goal, mape, pool, pooled_real_against_real,
                                shared_cells, simulate_pooled, simulate_record, simulated_cells)

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "fidelity"
RUNS = GOLDEN / "runs"   # benchmarks/fidelity_noise.py --record-pooled: several runs of one grid, and pooled.json
LOOSE = 2.0              # the bound: twice the error the simulator had against the pooled runs when recorded


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


def test_a_decisive_figure_beyond_15_percent_or_without_a_real_value_counts_against_the_goal():
    from trtpd.sim.fidelity import Row

    rows = {"w": [Row("TTFT P50", 100.0, 110.0, True), Row("TTFT P90", 100.0, 120.0, True),
                  Row("TTFT P99", 100.0, 200.0, False), Row("TPOT P50", 0.0, 5.0, True),
                  Row("goodput/s", 2.0, 1.8, True)]}
    assert beyond_goal(rows) == (2, 4)   # +20% and a real 0 (no error to read); P99 is not judged


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


def test_the_simulator_against_the_recorded_runs_pooled_stays_within_twice_its_recorded_error():
    """The runs of one grid recorded on one machine (each with the profile measured at its start), pooled: a change
    to the simulator that doubles its MAPE against them on any workload, or the count of decisive figures beyond
    15%, fails. Pooled, the real side's own spread is below the simulator's error (benchmarks/fidelity_noise.py),
    so this reads the simulator where one run of 30 requests per cell reads mostly the machine."""
    manifest = json.loads((RUNS / "pooled.json").read_text())
    runs = [FidelityRecord.load(RUNS / name) for name in manifest["runs"]]
    assert len(runs) >= 6
    assert len(shared_cells(runs)) == len(runs[0].cells) == 18   # every cell of the grid, in every run
    pooled = simulate_pooled(runs)
    assert set(pooled) == set(manifest["mape_at_record"])
    for workload, then in manifest["mape_at_record"].items():
        now = mape(pooled[workload])
        assert now <= LOOSE * then, (f"{workload}: the simulator's MAPE against the {len(runs)} recorded runs pooled "
                                     f"is {now:.1%}, more than {LOOSE:g}x the {then:.1%} it had when recorded")
    beyond, decisive = beyond_goal(pooled)
    assert decisive == manifest["decisive"] == 90
    assert beyond <= LOOSE * max(1, manifest["beyond_at_record"]), (
        f"{beyond} of {decisive} decisive figures beyond 15% against the pooled runs, "
        f"{manifest['beyond_at_record']} when recorded")
