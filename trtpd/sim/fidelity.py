"""Simulation against reality, cell by cell: the percentiles and goodput that decide a plan, their errors and the
mean absolute percentage error (MAPE). Pure.

A cell is one workload at one rate in one mode: the same requests (arrivals and lengths) through a real deployment
and through the simulator. `benchmarks/validate_sim.py` measures the real side and prints the comparison; it can
record a run (`FidelityRecord`: the measured hardware profile, the clusters' options, each cell's requests and real
latencies) so that the simulator can be held against that measurement later on any machine, deterministically:
tests/unit/sim/test_fidelity_record.py fails when a change to the simulator doubles the recorded error.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from trtpd.percentiles import quantile
from trtpd.sim.metrics import Latencies

PERCENTILES = (50, 90, 99)
GOAL = 0.15   # issue 24: every decisive figure (TTFT and TPOT at P50/P90, goodput) within 15% of the real fleet
MODES = ("disaggregated", "colocated")


@dataclass(frozen=True)
class Row:
    """One compared figure of a cell: ms for the latencies, requests/s for goodput."""

    name: str            # "TTFT P50", ..., "goodput/s"
    real: float
    sim: float
    decisive: bool       # P50/P90 and goodput decide a plan; P99 is printed, not judged by the goal

    @property
    def error(self) -> float:
        """(sim - real) / real; NaN when the real figure is 0 or missing."""
        return (self.sim - self.real) / self.real if self.real and not math.isnan(self.real) else float("nan")

    @property
    def misses_goal(self) -> bool:
        """A decisive figure beyond GOAL, or without a real value to judge it by."""
        return self.decisive and not abs(self.error) <= GOAL


def pct_ms(values: np.ndarray, p: int) -> float:
    """The P`p` in ms, by trtpd's one percentile definition (trtpd/percentiles.py)."""
    q = quantile(values, p / 100)
    return float("nan") if q is None else q * 1e3


def cell_rows(real: Latencies, sim: Latencies, rate_per_s: float, ttft_slo_s: float, tpot_slo_s: float) -> list[Row]:
    """TTFT and TPOT at P50/P90/P99, and goodput (the offered rate times the share of requests that meet both
    SLOs, Latencies.attainment)."""
    rows = [Row(f"{m.split('_')[0].upper()} P{p}", pct_ms(getattr(real, m), p), pct_ms(getattr(sim, m), p), p < 99)
            for m in ("ttft_s", "tpot_s") for p in PERCENTILES]
    rows.append(Row("goodput/s", rate_per_s * real.attainment(ttft_slo_s, tpot_slo_s),
                    rate_per_s * sim.attainment(ttft_slo_s, tpot_slo_s), True))
    return rows


def mape(rows: list[Row]) -> float:
    """Mean |error| over the rows that have one; NaN when none has."""
    errors = [abs(r.error) for r in rows if not math.isnan(r.error)]
    return float(np.mean(errors)) if errors else float("nan")


def beyond_goal(rows: dict[str, list[Row]]) -> tuple[int, int]:
    """How many decisive figures lie beyond GOAL, and how many there are (a figure without a real value counts as
    beyond)."""
    decisive = [r for values in rows.values() for r in values if r.decisive]
    return sum(1 for r in decisive if r.misses_goal), len(decisive)


def worst_decisive(rows: list[Row]) -> float:
    return max((abs(r.error) for r in rows if r.decisive and not math.isnan(r.error)), default=0.0)


# ---- a recorded run -------------------------------------------------------------------------------------------
@dataclass
class RecordedCell:
    workload: str
    rate_per_s: float
    mode: str
    arrival_s: list[float]
    input_tokens: list[int]
    output_tokens: list[int]
    real_ttft_s: list[float | None]
    real_tpot_s: list[float | None]
    real_done: list[bool]
    # the machine's speed around the cell's deployment over the profile's (trtpd.engine.profiling.speed_ratio:
    # the mean of a check before it started and one after it stopped; 1.0 in records made before the check)
    speed_ratio: float = 1.0

    def real(self) -> Latencies:
        def arr(values):
            return np.array([np.nan if v is None else v for v in values], dtype=float)
        return Latencies(arr(self.real_ttft_s), arr(self.real_tpot_s), np.array(self.real_done, dtype=bool))


@dataclass
class FidelityRecord:
    """What one validate_sim run measured, enough to simulate its cells again anywhere."""

    machine: str                  # where the real side and the profile were measured (curves_origin's words)
    recorded_at: str
    model: str
    hardware_yaml: str            # the profile measured in the same run (trtpd profile --serving)
    options: dict                 # ClusterOptions of the engines the real deployments ran
    ttft_slo_s: float
    tpot_slo_s: float
    seed: int
    cells: list[RecordedCell] = field(default_factory=list)
    mape_at_record: dict[str, float] = field(default_factory=dict)   # per workload, the simulator as it was then

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> "FidelityRecord":
        data = json.loads(Path(path).read_text())
        data["cells"] = [RecordedCell(**c) for c in data["cells"]]
        return cls(**data)

    def workloads(self) -> list[str]:
        return list(dict.fromkeys(c.workload for c in self.cells))


def mirrored_clusters(model, hardware, options) -> dict:
    """The simulated clusters that mirror validate_sim's real deployments, by mode: the engines' options, and the
    colocated instances routed as the real deployment routes them. Its instances are one Triton model's instance
    group (instance_count 2 in one tritonserver), and Triton hands each request to its instances in turn, whatever
    their load: the role model's execute() only queues the request for its engine and returns at once, so every
    instance is free when the next one comes (Triton schedules "as soon as a model instance is available",
    docs/user_guide/rate_limiter.md, rate limiting off; measured 2026-12-04: 8 requests sent one after another went
    to instances 1, 0, 1, 0, ..., and two sent 50 ms apart to both). The gateway's fleet routes by load instead
    (the simulator's default, what the planner plans)."""
    from dataclasses import replace

    clusters = fleet_clusters(model, hardware, options)
    return {**clusters, "colocated": replace(clusters["colocated"], routing="round_robin")}


def fleet_clusters(model, hardware, options) -> dict:
    """The simulated clusters of the gateway's fleets, by mode (what `trtpd demo` runs and the planner plans): the
    engines' options, every instance its own tritonserver, the colocated instances routed by load as the gateway's
    routing core routes them (the simulator's default)."""
    from trtpd.sim.cluster_specs import colocated_cluster, disaggregated_cluster

    return {"disaggregated": disaggregated_cluster(model, hardware, options),
            "colocated": colocated_cluster(model, hardware, options)}


def real_latencies(results) -> Latencies:
    """Real requests' timings (trtpd.bench.client.RequestResult) in the simulator's per-request form, so both are
    judged by one rule; a request that failed or never answered has NaN latencies and counts as not completed."""
    ttft = np.array([np.nan if r.ttft_s is None else r.ttft_s for r in results], dtype=float)
    tpot = np.array([np.nan if r.tpot_s is None else r.tpot_s for r in results], dtype=float)
    return Latencies(ttft, tpot, np.array([r.error is None and r.ttft_s is not None for r in results], dtype=bool))


def at_speed(hardware, model: str, ratio: float):
    """`hardware` with `model`'s measured curves (prefill, long prompts, decode) times `ratio`: the engine as fast as
    a speed check found the machine (trtpd.engine.profiling.speed_ratio); its serving costs as measured."""
    if ratio == 1.0:
        return hardware
    measured = []
    for m in hardware.measured:
        if m.model == model:
            p, d = m.prefill, m.decode
            m = m.model_copy(update={
                "prefill": p.model_copy(update={"latency_s": [x * ratio for x in p.latency_s],
                                                "single_latency_s": [x * ratio for x in p.single_latency_s]}),
                "decode": d.model_copy(update={"step_latency_s": [[x * ratio for x in row]
                                                                  for row in d.step_latency_s]})})
        measured.append(m)
    return hardware.model_copy(update={"measured": measured})


def simulated_cells(record: FidelityRecord, follow_speed: bool = False) -> list[tuple[RecordedCell, Latencies]]:
    """Each recorded cell simulated again with the recorded profile and options: the cell and its simulated
    latencies, in the record's order. follow_speed: each cell's curves at the machine's speed checked around it
    (RecordedCell.speed_ratio)."""
    import yaml

    from trtpd.catalog import get_model
    from trtpd.perf.hardware import HardwareProfile
    from trtpd.perf.yaml_io import load_model
    from trtpd.sim.metrics import latencies
    from trtpd.sim.options import ClusterOptions
    from trtpd.sim.simulator import simulate
    from trtpd.sim.workload import RequestArrays

    hardware = load_model(HardwareProfile, yaml.safe_load(record.hardware_yaml), "the recorded profile")
    model, options = get_model(record.model), ClusterOptions(**record.options)
    clusters: dict[float, dict] = {}
    out = []
    for cell in record.cells:
        ratio = cell.speed_ratio if follow_speed else 1.0
        if ratio not in clusters:
            clusters[ratio] = mirrored_clusters(model, at_speed(hardware, record.model, ratio), options)
        run = simulate(clusters[ratio][cell.mode],
                       RequestArrays(cell.arrival_s, cell.input_tokens, cell.output_tokens))
        out.append((cell, latencies(run, warmup_fraction=0.0)))
    return out


def simulate_record(record: FidelityRecord, follow_speed: bool = False) -> dict[str, list[Row]]:
    """Each recorded cell simulated again (simulated_cells) and compared with its real latencies: the rows per
    workload."""
    rows: dict[str, list[Row]] = {}
    for cell, sim in simulated_cells(record, follow_speed):
        rows.setdefault(cell.workload, []).extend(
            cell_rows(cell.real(), sim, cell.rate_per_s, record.ttft_slo_s, record.tpot_slo_s))
    return rows


def real_against_real(first: FidelityRecord, second: FidelityRecord) -> dict[str, list[Row]]:
    """The real fleet against itself: each cell both records measured (the same workload, rate, mode, arrivals and
    lengths), the first run's latencies in the rows' "real" and the second's in their "sim", by workload. Its MAPE
    is how far apart two measurements of the same requests on the same machine lie: the floor below which no
    simulator's error against one run can be read (benchmarks/fidelity_noise.py). Each group of one run: see
    pooled_real_against_real."""
    return pooled_real_against_real([first], [second])


# ---- several runs of the same grid, pooled ---------------------------------------------------------------------
def _cell_key(cell: RecordedCell) -> tuple:
    return cell.workload, cell.rate_per_s, cell.mode


def _same_requests(a: RecordedCell, b: RecordedCell) -> bool:
    return (a.arrival_s, a.input_tokens, a.output_tokens) == (b.arrival_s, b.input_tokens, b.output_tokens)


def pool(samples: list[Latencies]) -> Latencies:
    """Several runs' requests as one sample: their percentiles and attainment over all of them."""
    return Latencies(np.concatenate([s.ttft_s for s in samples]), np.concatenate([s.tpot_s for s in samples]),
                     np.concatenate([s.done for s in samples]))


def shared_cells(records: list[FidelityRecord]) -> list[RecordedCell]:
    """The first record's cells that every record measured with the same requests (workload, rate, mode,
    arrivals and lengths: the same seed), in its order."""
    by_key = [{_cell_key(c): c for c in r.cells} for r in records[1:]]
    return [cell for cell in records[0].cells
            if all(_cell_key(cell) in other and _same_requests(cell, other[_cell_key(cell)]) for other in by_key)]


def pooled_rows(real: dict[tuple, list[Latencies]], other: dict[tuple, list[Latencies]], cells: list[RecordedCell],
                ttft_slo_s: float, tpot_slo_s: float) -> dict[str, list[Row]]:
    """Each cell's pooled `real` samples against its pooled `other` ones (both by _cell_key), by workload."""
    rows: dict[str, list[Row]] = {}
    for cell in cells:
        key = _cell_key(cell)
        rows.setdefault(cell.workload, []).extend(
            cell_rows(pool(real[key]), pool(other[key]), cell.rate_per_s, ttft_slo_s, tpot_slo_s))
    return rows


def simulate_pooled(records: list[FidelityRecord]) -> dict[str, list[Row]]:
    """The simulator against several real runs of the same grid at once: in each cell they all measured with the
    same requests, every run's real requests together against every run's simulated requests together (each run
    simulated with its own profile, measured at its start), by workload. A single run of 30 requests per cell
    reads a P90 from its third-highest request, and two runs of the same requests on the same machine disagree
    beyond 15% on 8-30 of the grid's 90 decisive figures (real_against_real): pooled, the real side's own spread
    (pooled_real_against_real) falls below the simulator's error, which is then what the figures show."""
    cells = shared_cells(records)
    real: dict[tuple, list[Latencies]] = {}
    sim: dict[tuple, list[Latencies]] = {}
    wanted = {_cell_key(c) for c in cells}
    for record in records:
        for cell, simulated in simulated_cells(record):
            if _cell_key(cell) in wanted:
                real.setdefault(_cell_key(cell), []).append(cell.real())
                sim.setdefault(_cell_key(cell), []).append(simulated)
    return pooled_rows(real, sim, cells, records[0].ttft_slo_s, records[0].tpot_slo_s)


def pooled_real_against_real(first: list[FidelityRecord], second: list[FidelityRecord]) -> dict[str, list[Row]]:
    """One group of real runs pooled against another (the same cells and requests): the spread left in the real
    side once pooled, the floor under simulate_pooled's error."""
    cells = shared_cells(first + second)

    def samples(records: list[FidelityRecord]) -> dict[tuple, list[Latencies]]:
        out: dict[tuple, list[Latencies]] = {}
        for record in records:
            for cell in record.cells:
                out.setdefault(_cell_key(cell), []).append(cell.real())
        return out

    return pooled_rows(samples(first), samples(second), cells, first[0].ttft_slo_s, first[0].tpot_slo_s)
