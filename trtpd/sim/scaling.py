"""Instance counts that change during a run: what the simulator measures for a scaler, and each instance's life.

Every `interval_s` of simulated time the simulator measures what a live controller reads from the fleet's
metrics (FleetMetrics: arrivals and their lengths over a window, the gateway's TTFT and TPOT, each role's
waiting requests, queue times and busy share; latencies at `quantile`, the SLO's attainment) and calls a
Scaler, which answers target instance counts per role. The scaler is a callable so that this package need
not know who decides (trtpd.autoscale.core, through trtpd.autoscale.simulated: the planner imports the
simulator, so the simulator cannot import a core that uses the planner's models).

An instance's life: created (it holds its devices from then on) -> ready after `startup_s` (the router gets
it) -> draining (the router sends it nothing new) -> removed once it holds no work. A starting instance that
is scaled away is removed at once.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Mapping, Protocol

import numpy as np

from trtpd.percentiles import quantile
from trtpd.sim.records import RequestRecords

LOOKBACK_WINDOWS = 4   # requests still queued are looked for among those arrived in the last 4 windows


@dataclass(frozen=True)
class ScalingOptions:
    interval_s: float = 10.0      # a scaler call every this much simulated time
    window_s: float = 30.0        # rates, means and percentiles over this much history
    startup_s: float = 30.0       # an added instance takes requests this long after it starts (loading)
    quantile: float = 0.9         # latencies are measured at this quantile (the SLO's attainment)

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.window_s <= 0:
            raise ValueError(f"interval_s and window_s must be positive, got {self.interval_s} and {self.window_s}")
        if self.startup_s < 0:
            raise ValueError(f"startup_s must be >= 0, got {self.startup_s}")
        if not 0 < self.quantile < 1:
            raise ValueError(f"quantile must be in (0, 1), got {self.quantile}")


@dataclass
class InstanceLife:
    name: str                     # prefill-<i>, decode-<i>, colocated-<i>; i is never reused
    role: str
    index: int
    created_s: float
    ready_s: float = math.nan
    drain_s: float = math.nan
    removed_s: float = math.nan

    @property
    def state(self) -> str:
        if not math.isnan(self.removed_s):
            return "removed"
        if not math.isnan(self.drain_s):
            return "draining"
        return "starting" if math.isnan(self.ready_s) else "ready"

    def held_s(self, end_s: float) -> float:
        """Seconds it held its devices: from creation to removal (or to the end of the run)."""
        until = end_s if math.isnan(self.removed_s) else self.removed_s
        return max(0.0, until - self.created_s)


@dataclass(frozen=True)
class ScaleEvent:
    now_s: float
    role: str
    before: int                   # starting + ready instances
    after: int


@dataclass(frozen=True)
class RoleMetrics:
    role: str
    num_ready: int
    num_starting: int
    num_draining: int
    waiting_requests: int          # queued at the role's instances, not yet in a batch
    queue_time_p_s: float | None     # waits that ended in the window and the ages of those still waiting
    busy_share: float              # share of the last interval its ready and draining instances computed


@dataclass(frozen=True)
class FleetMetrics:
    now_s: float
    window_s: float                # the span measured (shorter than asked at the start of a run)
    num_arrivals: int
    mean_input_tokens: float
    mean_output_tokens: float      # requested lengths of the window's arrivals (the gateway's max_tokens)
    ttft_p_s: float | None         # of the first tokens sent in the window
    tpot_p_s: float | None         # of the requests finished in the window
    roles: dict[str, RoleMetrics]

    @property
    def arrival_rate_per_s(self) -> float:
        return self.num_arrivals / self.window_s if self.window_s > 0 else 0.0


class Scaler(Protocol):
    def __call__(self, metrics: FleetMetrics) -> Mapping[str, int] | None:
        """Target instance counts (starting + ready) per role, or None to change nothing."""
        ...


@dataclass(frozen=True)
class WindowLatencies:
    num_arrivals: int
    mean_input_tokens: float
    mean_output_tokens: float
    ttft_p_s: float | None
    tpot_p_s: float | None
    prefill_queue_p_s: float | None     # arrival -> prefill batch (colocated: -> its step)
    decode_queue_p_s: float | None      # prefill done -> decode admitted it


def window_latencies(records: RequestRecords, now_s: float, window_s: float, response_latency_s: float = 0.0,
                     q: float = 0.9) -> WindowLatencies:
    arrival = records.arrival_s
    start_s = now_s - window_s
    lo = bisect.bisect_left(arrival, now_s - LOOKBACK_WINDOWS * window_s)
    first_new = bisect.bisect_right(arrival, start_s, lo)
    hi = bisect.bisect_right(arrival, now_s, lo)
    a = np.asarray(arrival[lo:hi])
    rejected = np.asarray(records.rejected[lo:hi], dtype=bool)
    p_start, p_end = np.asarray(records.prefill_start_s[lo:hi]), np.asarray(records.prefill_end_s[lo:hi])
    t_start = np.asarray(records.transfer_start_s[lo:hi])
    first, done = np.asarray(records.first_token_s[lo:hi]), np.asarray(records.done_s[lo:hi])
    out = np.asarray(records.output_tokens[lo:hi], dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        in_window = (first > start_s) & (first <= now_s)
        ttft = first[in_window] - a[in_window] + response_latency_s
        finished = (done > start_s) & (done <= now_s) & (out > 1)
        tpot = (done[finished] - first[finished]) / (out[finished] - 1)
        prefill_wait = np.concatenate([(p_start - a)[(p_start > start_s) & (p_start <= now_s)],
                                       (now_s - a)[np.isnan(p_start) & ~rejected]])
        decode_wait = np.concatenate([(t_start - p_end)[(t_start > start_s) & (t_start <= now_s)],
                                      (now_s - p_end)[(p_end <= now_s) & np.isnan(t_start)]])
    num_new = hi - first_new
    inputs, outputs = records.input_tokens[first_new:hi], records.output_tokens[first_new:hi]
    return WindowLatencies(num_new, sum(inputs) / num_new if num_new else 0.0,
                           sum(outputs) / num_new if num_new else 0.0, quantile(ttft, q), quantile(tpot, q),
                           quantile(prefill_wait, q), quantile(decode_wait, q))
