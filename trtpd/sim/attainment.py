"""A run's SLO attainment, decided while it runs: which requests are measured, and when the share that
meets the SLO is certain to end above (or below) the target whatever the rest of the run does.

The count is the one trtpd.sim.metrics computes at the end, request by request as each finishes: a
measured request meets the SLO when it finished with TTFT <= ttft_slo_s and (one token, or TPOT <=
tpot_slo_s), the same float operations in the same order (the response delay included); one refused or
not finished misses. A request still without its first token when (now + delay) - arrival > ttft_slo_s
misses whenever it finishes (its first token comes at now or later, and the difference only grows): it
is counted then (`late`, at each arrival). With n measured requests, `met / n >= attainment` can only
stay true and `(n - missed) / n < attainment` can only stay true as the run goes on.
"""

from __future__ import annotations

import bisect

from trtpd.sim.records import RequestRecords


def measured_start_index(arrival_s: list[float], warmup_fraction: float = 0.1, warmup_s: float = 0.0) -> int:
    """Index of the first measured request: past the first warmup_fraction of requests and past
    warmup_s of simulated time (e.g. the time decode batches need to fill: the longest output x TPOT)."""
    by_count = int(len(arrival_s) * warmup_fraction)
    by_time = bisect.bisect_left(arrival_s, arrival_s[0] + warmup_s) if arrival_s and warmup_s > 0 else 0
    return min(max(by_count, by_time), max(len(arrival_s) - 1, 0))


def measured_end_index(arrival_s: list[float], start: int, cooldown_s: float = 0.0) -> int:
    """One past the last measured request: none that arrives in the last cooldown_s (e.g. the longest output
    x TPOT) is measured. Those requests live on after the last arrival, when no new work competes with
    them; a finite run's drain flatters them (at least one request after `start` is measured)."""
    if cooldown_s <= 0 or not arrival_s:
        return len(arrival_s)
    return max(start + 1, bisect.bisect_right(arrival_s, arrival_s[-1] - cooldown_s))


class AttainmentWatch:
    def __init__(self, records: RequestRecords, ttft_slo_s: float, tpot_slo_s: float, attainment: float,
                 warmup_fraction: float = 0.1, warmup_s: float = 0.0, response_latency_s: float = 0.0,
                 cooldown_s: float = 0.0) -> None:
        self.records = records
        self.ttft_slo_s, self.tpot_slo_s, self.attainment = ttft_slo_s, tpot_slo_s, attainment
        self.response_latency_s = response_latency_s
        self.start = measured_start_index(records.arrival_s, warmup_fraction, warmup_s)
        self.end = min(len(records.arrival_s), measured_end_index(records.arrival_s, self.start, cooldown_s))
        self.num_measured = self.end - self.start
        self.num_met = 0
        self.num_missed = 0
        self.passed: bool | None = None      # decided: True (attainment >= target), False; None: not yet
        self._is_late = bytearray(len(records.arrival_s))   # counted as a miss before it finished
        self._next_late = self.start         # the oldest measured request not yet found late or served

    def late(self, now_s: float, num_arrived: int) -> None:
        """Counts the measured requests among the first num_arrived that have no first token at now_s
        and can no longer meet the TTFT target."""
        r, j = self.records, self._next_late
        arrival, first_token, rejected = r.arrival_s, r.first_token_s, r.rejected
        now_out_s = now_s + self.response_latency_s
        last = min(num_arrived, self.end)
        while j < last and now_out_s - arrival[j] > self.ttft_slo_s:   # later arrivals: less late
            if first_token[j] != first_token[j] and not rejected[j]:        # NaN: no first token yet
                self._is_late[j] = 1
                self.missed(j)
            j += 1
        self._next_late = j

    def finished(self, index: int) -> None:
        if not self.start <= index < self.end or self._is_late[index]:
            return
        r, delay = self.records, self.response_latency_s
        first_s, done_s = r.first_token_s[index] + delay, r.done_s[index] + delay
        outputs = r.output_tokens[index]
        meets = first_s - r.arrival_s[index] <= self.ttft_slo_s and \
            (outputs <= 1 or (done_s - first_s) / (outputs - 1) <= self.tpot_slo_s)
        if meets:
            self.num_met += 1
            if self.num_met / self.num_measured >= self.attainment:
                self.passed = True
        else:
            self.missed(index)

    def missed(self, index: int) -> None:
        """A measured request that will not meet the SLO (refused, or finished late)."""
        if not self.start <= index < self.end:
            return
        self.num_missed += 1
        if (self.num_measured - self.num_missed) / self.num_measured < self.attainment:
            self.passed = False
