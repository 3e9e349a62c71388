"""TTFT/TPOT percentiles, SLO attainment and goodput from a simulated run.

TTFT = first token - arrival. TPOT = (last token - first token) / (output tokens - 1), as the bench
tool and DistServe compute it. A request meets the SLO when TTFT <= ttft_s and TPOT <= tpot_s
(DistServe's attainment; a one-token request has no TPOT and meets that half). Goodput here is
the rate of requests that met the SLO; DistServe's goodput (the highest rate at which a share of
requests meets it) is `trtpd.sim.goodput.max_goodput_rate_per_s`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trtpd.percentiles import Percentiles, percentiles  # noqa: F401 - re-exported
from trtpd.sim.attainment import measured_end_index, measured_start_index
from trtpd.sim.simulator import SimRun

@dataclass(frozen=True)
class TtftBreakdown:
    """Mean seconds per stage, as the gateway reports it (seed 000 5.1)."""

    prefill_queue_s: float
    prefill_compute_s: float
    decode_queue_s: float     # waiting for a decode instance to admit it
    kv_transfer_s: float      # link queue + bytes / bandwidth


@dataclass(frozen=True)
class SimSummary:
    num_requests: int             # measured (after warm-up)
    num_unfinished: int
    ttft_s: Percentiles
    tpot_s: Percentiles
    slo_attainment: float | None
    goodput_per_s: float | None
    throughput_requests_per_s: float
    throughput_tokens_per_s: float
    ttft_breakdown: TtftBreakdown | None


@dataclass(frozen=True)
class Latencies:
    """Per-request arrays of the measured requests."""

    ttft_s: np.ndarray
    tpot_s: np.ndarray       # NaN where output_tokens == 1
    done: np.ndarray         # bool

    def attainment(self, ttft_slo_s: float, tpot_slo_s: float) -> float:
        ok = self.done & (self.ttft_s <= ttft_slo_s) & (np.isnan(self.tpot_s) | (self.tpot_s <= tpot_slo_s))
        return float(ok.mean()) if len(ok) else 0.0


def measured_start(run: SimRun, warmup_fraction: float = 0.1, warmup_s: float = 0.0) -> int:
    """Index of the first measured request (trtpd.sim.attainment.measured_start_index)."""
    return measured_start_index(run.records.arrival_s, warmup_fraction, warmup_s)


def measured_range(run: SimRun, warmup_fraction: float = 0.1, warmup_s: float = 0.0,
                   cooldown_s: float = 0.0) -> tuple[int, int]:
    """[start, end) of the measured requests: past the warm-up, before the cool-down (trtpd.sim.attainment)."""
    start = measured_start(run, warmup_fraction, warmup_s)
    return start, measured_end_index(run.records.arrival_s, start, cooldown_s)


def latencies(run: SimRun, warmup_fraction: float = 0.1, warmup_s: float = 0.0, cooldown_s: float = 0.0) -> Latencies:
    r = run.records
    start, end = measured_range(run, warmup_fraction, warmup_s, cooldown_s)
    arrival = np.asarray(r.arrival_s[start:end])
    first = np.asarray(r.first_token_s[start:end])
    done_s = np.asarray(r.done_s[start:end])
    out = np.asarray(r.output_tokens[start:end], dtype=np.float64)
    ttft = first - arrival
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (done_s - first) / (out - 1), np.nan)
    return Latencies(ttft, tpot, ~np.isnan(done_s))


def summarize(run: SimRun, ttft_slo_s: float | None = None, tpot_slo_s: float | None = None,
              warmup_fraction: float = 0.1, warmup_s: float = 0.0, cooldown_s: float = 0.0) -> SimSummary:
    """Throughput counts completed requests over first arrival to last completion; goodput counts
    the requests that met the SLO over the arrival span (the offered rate x attainment). Only the measured
    requests count (past the warm-up, before the cool-down: measured_range)."""
    r = run.records
    lat = latencies(run, warmup_fraction, warmup_s, cooldown_s)
    start, end = measured_range(run, warmup_fraction, warmup_s, cooldown_s)
    arrival = np.asarray(r.arrival_s[start:end])
    done_s = np.asarray(r.done_s[start:end])
    n = len(arrival)
    span = float(arrival[-1] - arrival[0]) if n > 1 else run.span_s
    num_done = int(lat.done.sum())
    busy_span = float(np.nanmax(done_s) - arrival[0]) if num_done else 0.0
    tokens = np.asarray(r.input_tokens[start:end]) + np.asarray(r.output_tokens[start:end])
    done_tokens = float(tokens[lat.done].sum())
    attainment = goodput = None
    if ttft_slo_s is not None and tpot_slo_s is not None:
        attainment = lat.attainment(ttft_slo_s, tpot_slo_s)
        goodput = attainment * n / span if span > 0 else None
    return SimSummary(
        num_requests=n, num_unfinished=n - num_done,
        ttft_s=percentiles(lat.ttft_s), tpot_s=percentiles(lat.tpot_s),
        slo_attainment=attainment, goodput_per_s=goodput,
        throughput_requests_per_s=num_done / busy_span if busy_span > 0 else 0.0,
        throughput_tokens_per_s=done_tokens / busy_span if busy_span > 0 else 0.0,
        ttft_breakdown=_breakdown(run, start, end))


def _breakdown(run: SimRun, start: int, end: int) -> TtftBreakdown | None:
    r = run.records
    arrival = np.asarray(r.arrival_s[start:end])
    p_start, p_end = np.asarray(r.prefill_start_s[start:end]), np.asarray(r.prefill_end_s[start:end])
    t_start, t_end = np.asarray(r.transfer_start_s[start:end]), np.asarray(r.transfer_end_s[start:end])
    if np.all(np.isnan(p_start)):
        return None
    if np.all(np.isnan(t_start)):
        return TtftBreakdown(float(np.nanmean(p_start - arrival)), float(np.nanmean(p_end - p_start)), 0.0, 0.0)
    return TtftBreakdown(float(np.nanmean(p_start - arrival)), float(np.nanmean(p_end - p_start)),
                         float(np.nanmean(t_start - p_end)), float(np.nanmean(t_end - t_start)))
