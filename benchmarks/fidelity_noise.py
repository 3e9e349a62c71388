"""How far apart two real runs of the same requests lie, beside the simulator's error against each.

benchmarks/validate_sim.py --record writes each run of its grid (the same seed sends the same requests: arrivals,
prompts and output lengths) with its own profile, measured at the start of that run. Given two or more such
records, this prints
- for each record, the simulator's MAPE per workload against that run (its own profile; as validate_sim printed),
  its largest P50/P90/goodput error and how many of those decisive figures lie beyond 15%,
- for each pair of records, the same figures with one real run standing for the other's prediction
  (trtpd.sim.fidelity.real_against_real): the machine's own run-to-run spread, the floor under any simulator's
  error against a single run;
- all records pooled (trtpd.sim.fidelity.simulate_pooled): in each cell, every run's real requests together against
  every run's simulated requests together (each run with its own profile), and, for the spread left once pooled,
  the runs in two groups held against each other (alternate records, in the order given:
  pooled_real_against_real). With 30 requests per cell a single run reads a P90 from its third-highest request;
  pooled over six runs, from 180.
Run: .venv/bin/python benchmarks/fidelity_noise.py RECORD.json RECORD.json [...]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

from trtpd.sim.fidelity import (GOAL, PERCENTILES, FidelityRecord, RecordedCell, Row, beyond_goal, mape,
                                 pooled_real_against_real, real_against_real, shared_cells, simulate_pooled,
                                 simulate_record, worst_decisive)

CELL_ROWS = 2 * len(PERCENTILES) + 1   # fidelity.cell_rows: TTFT and TPOT at each percentile, goodput


def summary(rows: dict[str, list[Row]]) -> str:
    beyond, decisive = beyond_goal(rows)
    per_workload = ", ".join(f"{w} {mape(v):.1%}" for w, v in rows.items())
    largest = max((worst_decisive(v) for v in rows.values()), default=0.0)
    return f"MAPE {per_workload}; largest {largest:.0%}; beyond {GOAL:.0%}: {beyond} of {decisive}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("records", nargs="+", type=Path)
    ap.add_argument("--record-pooled", type=Path, metavar="DIR",
                    help="write the records (compact) and the pooled figures (pooled.json) into DIR, for "
                         "tests/unit/sim/test_pooled_runs.py to replay")
    args = ap.parse_args()
    if len(args.records) < 2:
        ap.error("give at least two records of the same grid")
    records = {path: FidelityRecord.load(path) for path in args.records}
    print("the simulator against each run (its own profile):")
    for path, record in records.items():
        print(f"  {path} ({record.recorded_at}): {summary(simulate_record(record))}")
    print("one real run against another (the same requests):")
    for (a, ra), (b, rb) in itertools.combinations(records.items(), 2):
        rows = real_against_real(ra, rb)
        if not rows:
            print(f"  {a} vs {b}: no cell in common (another seed, rate or workload)")
            continue
        print(f"  {a} vs {b}: {summary(rows)}")
    runs = list(records.values())
    pooled = simulate_pooled(runs)
    if not pooled:
        print("pooled: no cell that every record measured with the same requests")
        return 0
    print(f"all {len(runs)} runs pooled, the simulator against them: {summary(pooled)}")
    for row in beyond(pooled, shared_cells(runs)):
        print(f"    {row}")
    if len(runs) >= 4:
        halves = pooled_real_against_real(runs[0::2], runs[1::2])
        print(f"pooled, alternate runs against the others (real against real): {summary(halves)}")
    if args.record_pooled:
        record_pooled(args.record_pooled, records, pooled)
        print(f"recorded into {args.record_pooled}")
    return 0


def record_pooled(folder: Path, records: dict[Path, FidelityRecord], pooled: dict[str, list[Row]]) -> None:
    """Each record as compact JSON (named by when it was recorded) and pooled.json: the runs in order, the pooled
    MAPE per workload and how many decisive figures lay beyond the goal, with today's simulator."""
    import datetime
    import json
    from dataclasses import asdict

    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for record in records.values():
        name = "run-" + record.recorded_at[:16].replace(":", "") + ".json"
        (folder / name).write_text(json.dumps(asdict(record), separators=(",", ":")) + "\n")
        names.append(name)
    beyond, decisive = beyond_goal(pooled)
    (folder / "pooled.json").write_text(json.dumps({
        "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "runs": names, "mape_at_record": {w: mape(v) for w, v in pooled.items()},
        "beyond_at_record": beyond, "decisive": decisive}, indent=1) + "\n")


def beyond(rows: dict[str, list[Row]], cells: list[RecordedCell]) -> list[str]:
    """The decisive figures beyond the goal, each named by its cell (rows come CELL_ROWS a cell, in the cells'
    order within each workload)."""
    out = []
    for workload, values in rows.items():
        mine = [c for c in cells if c.workload == workload]
        for i, r in enumerate(values):
            if r.misses_goal:
                cell = mine[i // CELL_ROWS]
                out.append(f"{workload} {cell.rate_per_s:g}/s {cell.mode} {r.name}: real {r.real:.1f}, "
                           f"simulated {r.sim:.1f} ({r.error:+.0%})")
    return out


if __name__ == "__main__":
    sys.exit(main())
