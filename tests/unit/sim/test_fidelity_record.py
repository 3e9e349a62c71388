"""The simulator held against a recorded run of the real fleet (issue 24's CI slice).

`benchmarks/validate_sim.py --record` measured real reference deployments (1P1D and colocated x2, through the real
tritonserver) on one machine, with the hardware profile `trtpd profile --serving` measured in the same run, and
wrote each cell's requests and real latencies (tests/golden/fidelity/record.json; its `machine` and `recorded_at`
say where and when). Here the same requests are simulated again with that profile: nothing depends on this
machine, and a change to the simulator that doubles its error against that measurement fails. The benchmark
itself (the real side, on the machine it runs on) is not run here: its numbers are in the README.
"""

from __future__ import annotations

import math
from pathlib import Path

from trtpd.sim.fidelity import FidelityRecord, mape, simulate_record

RECORD = Path(__file__).resolve().parents[2] / "golden" / "fidelity" / "record.json"
LOOSE = 2.0      # the bound: twice the error the simulator had when the run was recorded


def test_the_simulator_stays_within_twice_its_recorded_error_on_every_workload():
    record = FidelityRecord.load(RECORD)
    rows = simulate_record(record)
    assert set(rows) == set(record.mape_at_record) and len(rows) >= 2
    for workload, then in record.mape_at_record.items():
        now = mape(rows[workload])
        assert not math.isnan(now)
        assert now <= LOOSE * then, (f"{workload}: the simulator's MAPE against the recorded fleet is {now:.1%}, "
                                     f"more than {LOOSE:g}x the {then:.1%} it had when recorded")


def test_the_record_covers_both_modes_light_load_and_long_outputs():
    record = FidelityRecord.load(RECORD)
    assert {c.mode for c in record.cells} == {"disaggregated", "colocated"}
    assert len({c.rate_per_s for c in record.cells}) >= 2
    assert all(len(c.arrival_s) == len(c.real_ttft_s) >= 20 for c in record.cells)
    assert "measured" in record.hardware_yaml and record.machine
