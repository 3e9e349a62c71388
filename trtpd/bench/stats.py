"""Summaries of a bench run: TTFT/TPOT percentiles, throughput, SLO attainment, TTFT breakdown."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from trtpd.bench.client import RequestResult
from trtpd.perf_outputs import TTFT_PHASES_MS
from trtpd.sim.metrics import Percentiles, percentiles  # noqa: F401  (percentiles: the one function, re-exported)


@dataclass(frozen=True)
class BenchSummary:
    label: str
    num_requests: int
    num_errors: int
    ttft_s: Percentiles
    tpot_s: Percentiles
    itl_s: Percentiles                  # every inter-token gap of every request, pooled
    worst_stall_s: Percentiles          # each request's longest gap
    output_tokens_per_s: float
    requests_per_s: float
    duration_s: float
    slo_attainment: float | None
    breakdown_ms: dict[str, float]      # mean prefill_queue / prefill_compute / kv_transfer / decode_queue

    def to_dict(self) -> dict:
        d = asdict(self)
        for name in ("ttft_s", "tpot_s", "itl_s", "worst_stall_s"):
            d[name] = getattr(self, name).as_dict()
        return d


def summarize(label: str, results: list[RequestResult], ttft_slo_s: float | None = None,
              tpot_slo_s: float | None = None) -> BenchSummary:
    ok = [r for r in results if r.error is None and r.token_times_s]
    errors = len(results) - len(ok)
    start = min((r.sent_s for r in results), default=0.0)
    end = max((r.token_times_s[-1] for r in ok), default=start)
    duration = max(end - start, 1e-9)
    tokens = sum(len(r.token_ids) or r.num_tokens for r in ok)
    attainment = None
    if ttft_slo_s is not None and tpot_slo_s is not None and results:
        met = sum(1 for r in ok if r.ttft_s <= ttft_slo_s and (r.tpot_s is None or r.tpot_s <= tpot_slo_s))
        attainment = met / len(results)
    keys = TTFT_PHASES_MS
    breakdown = {k: float(np.mean([r.perf[k] for r in ok if k in r.perf])) for k in keys
                 if any(k in r.perf for r in ok)}
    return BenchSummary(label, len(results), errors, percentiles([r.ttft_s for r in ok]),
                        percentiles([r.tpot_s for r in ok]), percentiles([g for r in ok for g in r.gaps_s]),
                        percentiles([r.worst_stall_s for r in ok]), tokens / duration, len(ok) / duration, duration,
                        attainment, breakdown)


def comparison_table(summaries: list[BenchSummary]) -> list[list[str]]:
    """Rows for a side-by-side table: metric, then one column per run."""
    rows = [["requests (errors)"] + [f"{s.num_requests} ({s.num_errors})" for s in summaries]]
    for name, attr in (("TTFT", "ttft_s"), ("ITL", "itl_s"), ("TPOT", "tpot_s"), ("worst stall", "worst_stall_s")):
        for p in ("p50", "p90", "p99"):
            rows.append([f"{name} {p.upper()} (ms)"] + [f"{getattr(getattr(s, attr), p) * 1000:.1f}" for s in summaries])
    rows.append(["output tokens/s"] + [f"{s.output_tokens_per_s:.1f}" for s in summaries])
    rows.append(["requests/s"] + [f"{s.requests_per_s:.2f}" for s in summaries])
    if any(s.slo_attainment is not None for s in summaries):
        rows.append(["SLO attainment"] + ["-" if s.slo_attainment is None else f"{s.slo_attainment:.0%}"
                                           for s in summaries])
    keys = sorted({k for s in summaries for k in s.breakdown_ms})
    for k in TTFT_PHASES_MS:
        if k in keys:
            rows.append([f"mean {k.replace('_ms', '')} (ms)"] + [f"{s.breakdown_ms[k]:.1f}" if k in s.breakdown_ms
                                                                   else "-" for s in summaries])
    return rows
