"""A simulated prefill instance, batching with the reference engine's PrefillScheduler.

The instance keeps each request's KV (counted in tokens against its KV capacity) until the decode
side has pulled it, so a slow decode side backs up into prefill, as on the real engine. A batch
is only formed within the free KV (`max_tokens_available`).
"""

from __future__ import annotations

from typing import Callable

from trtpd.perf.model import PerfModel
from trtpd.sched.prefill import PrefillBatch, PrefillRequest, PrefillScheduler, PrefillSchedulerConfig
from trtpd.sim.events import EventLoop
from trtpd.sim.records import RequestRecords
from trtpd.sim.shared_cores import SharedCores

TIMER_EPSILON_S = 1e-9  # fire a bucket timeout just after its deadline, past float rounding


class PrefillInstance:
    def __init__(self, index: int, loop: EventLoop, perf: PerfModel, config: PrefillSchedulerConfig,
                 kv_capacity_tokens: int, records: RequestRecords,
                 on_prefilled: Callable[[float, int], None], shared: SharedCores | None = None) -> None:
        self.index = index
        self.loop = loop
        self.perf = perf
        self.scheduler = PrefillScheduler(config)
        self.free_kv_tokens = kv_capacity_tokens
        self.records = records
        self.on_prefilled = on_prefilled   # (now_s, request index): hand the request to decode
        self.is_busy = False
        self.timer_at_s: float | None = None
        self.queued_tokens = 0             # waiting + in the running batch: the router's load signal
        self.busy_s = 0.0
        self._prefill_s: dict[tuple[int, int], float] = {}   # perf.prefill_s by (tokens, sum of squares)
        self.shared = shared               # cores shared with the other instances (trtpd.sim.shared_cores)

    def add(self, now_s: float, index: int) -> None:
        num_tokens = self.records.input_tokens[index]
        self.scheduler.add(PrefillRequest(index, num_tokens, now_s))
        self.queued_tokens += num_tokens
        self.records.prefill_instance[index] = self.index
        if not self.is_busy:
            self.try_start(now_s)

    def try_start(self, now_s: float, _: object = None) -> None:
        if self.is_busy:
            return
        batch = self.scheduler.schedule(now_s, self.free_kv_tokens)
        if batch is None:
            deadline = self.scheduler.next_deadline_s()
            if deadline is not None and deadline > now_s - TIMER_EPSILON_S:
                at = deadline + TIMER_EPSILON_S
                timer = self.timer_at_s
                if timer is None or timer <= now_s or at < timer:
                    self.timer_at_s = at
                    self.loop.push(at, self.try_start)
            return  # otherwise blocked on free KV: a finished transfer calls try_start again
        num_tokens = sum_sq = 0
        prefill_start = self.records.prefill_start_s
        for request in batch.requests:
            n = request.num_tokens
            num_tokens += n
            sum_sq += n * n
            prefill_start[request.request_id] = now_s
        key = (num_tokens, sum_sq)
        duration_s = self._prefill_s.get(key)
        if duration_s is None:   # a perf model is a pure function of its arguments: batches repeat
            duration_s = self._prefill_s[key] = self.perf.prefill_s(num_tokens, sum_sq)
        self.busy_s += duration_s
        self.free_kv_tokens -= num_tokens
        self.is_busy = True
        if self.shared is not None:
            self.shared.run(self, now_s, duration_s, self._done, batch, prompt_pass=True)
        else:
            self.loop.push(now_s + duration_s, self._done, batch)

    def _done(self, now_s: float, batch: PrefillBatch) -> None:
        self.is_busy = False
        prefill_end = self.records.prefill_end_s
        for request in batch.requests:
            prefill_end[request.request_id] = now_s
            self.queued_tokens -= request.num_tokens
            self.on_prefilled(now_s, request.request_id)
        self.try_start(now_s)

    def release_kv(self, now_s: float, num_tokens: int) -> None:
        """The decode side has pulled a request's KV."""
        self.free_kv_tokens += num_tokens
        if not self.is_busy and self.scheduler.num_waiting:
            self.try_start(now_s)
