"""A simulated colocated instance: one engine prefills new prompts inside its decode steps.

The same ContinuousBatchScheduler as decode, with prefill_in_step=True: at each step boundary it
admits waiting prompts within the step's token budget, and the step's latency covers both the
prompts and the running sequences' decode. That is where prefills interfere with decode: every
running sequence waits for the longer mixed step (the effect disaggregation removes).
"""

from __future__ import annotations

import heapq

from typing import Callable

from trtpd.perf.model import PerfModel
from trtpd.sched.block_allocator import BlockAllocator
from trtpd.sched.continuous import BatchSchedulerConfig, ContinuousBatchScheduler
from trtpd.sim.events import EventLoop
from trtpd.sim.records import RequestRecords
from trtpd.sim.sequence import SimSequence
from trtpd.sim.stepping import SteppingInstance


def mixed_step_s(perf: PerfModel, prefill_tokens: int, sum_sq_tokens: int, batch_size: int,
                 total_context_tokens: int) -> float:
    mixed = getattr(perf, "mixed_step_s", None)
    if mixed is not None:
        return mixed(prefill_tokens, sum_sq_tokens, batch_size, total_context_tokens)
    duration = perf.prefill_s(prefill_tokens, sum_sq_tokens) if prefill_tokens else 0.0
    if batch_size:
        duration += perf.decode_step_s(batch_size, total_context_tokens)
    return duration


class ColocatedInstance(SteppingInstance):
    def __init__(self, index: int, loop: EventLoop, perf: PerfModel, config: BatchSchedulerConfig,
                 num_blocks: int, tokens_per_block: int, records: RequestRecords,
                 exact_steps: bool = False, on_prefilled: Callable[[int], None] | None = None,
                 on_finished: Callable[[int], None] | None = None) -> None:
        if not config.prefill_in_step:
            raise ValueError("a colocated instance needs BatchSchedulerConfig(prefill_in_step=True)")
        self.index = index
        self.loop = loop
        self.perf = perf
        allocator = BlockAllocator(num_blocks, tokens_per_block)
        self.scheduler = ContinuousBatchScheduler(config, allocator)
        self.exact_steps = exact_steps
        self.records = records
        self.on_prefilled = on_prefilled   # (request index): its prompt left the queue (the router is told)
        self.on_finished = on_finished     # (request index): the router releases the request
        self.is_stepping = False
        self.num_steps = 0
        self.num_ready = 0
        self.total_context_tokens = 0
        self.prefilling: tuple[SimSequence, ...] = ()
        self.finishing: list[tuple[int, int, SimSequence]] = []
        self.num_assigned = 0
        self.queued_tokens = 0
        self.busy_s = 0.0
        self.sum_batch_steps = 0

    def add(self, now_s: float, index: int) -> None:
        records = self.records
        seq = SimSequence(index, records.input_tokens[index], records.output_tokens[index], now_s)
        self.scheduler.add(seq)
        self.num_assigned += 1
        self.queued_tokens += seq.num_prompt_tokens
        if not self.is_stepping:
            self._start_step(now_s)

    def _start_step(self, now_s: float) -> None:
        admitted: tuple[SimSequence, ...] = ()
        if self.exact_steps:
            plan = self.scheduler.schedule()
            admitted = plan.admitted
            if len(plan.decode) != self.num_ready:
                raise AssertionError(f"colocated {self.index}: scheduler batch {len(plan.decode)} != {self.num_ready}")
        elif self.scheduler.waiting:
            admitted = self.scheduler.admit(num_decode_rows=self.num_ready)
        prefill_tokens = sum_sq = 0
        if admitted:
            prefill_start = self.records.prefill_start_s
            for seq in admitted:
                n = seq.num_prompt_tokens
                prefill_tokens += n
                sum_sq += n * n
                prefill_start[seq.request_id] = now_s
        self.prefilling = admitted
        if not admitted and not self.num_ready:
            self.is_stepping = False
            return
        duration_s = mixed_step_s(self.perf, prefill_tokens, sum_sq, self.num_ready, self.total_context_tokens)
        self._begin_step(now_s, duration_s)

    def _step_done(self, now_s: float, _: object = None) -> None:
        self._end_step(now_s)
        records = self.records
        for seq in self.prefilling:       # prompts prefilled in this step: first token out now
            i = seq.request_id
            records.prefill_end_s[i] = now_s
            records.first_token_s[i] = now_s
            self.queued_tokens -= seq.num_prompt_tokens
            if self.on_prefilled is not None:
                self.on_prefilled(i)
            seq.is_ready = True
            if seq.max_new_tokens <= 1:
                self._finish(now_s, seq)
                continue
            seq.first_step = self.num_steps + 1
            seq.last_step = seq.first_step + seq.max_new_tokens - 2
            self.total_context_tokens += seq.num_prompt_tokens + 1
            self.num_ready += 1
            heapq.heappush(self.finishing, (seq.last_step, i, seq))
        self.prefilling = ()
        self._start_step(now_s)

    def _finish(self, now_s: float, seq: SimSequence) -> None:
        self.records.done_s[seq.request_id] = now_s
        self.records.num_done += 1
        if not self.exact_steps:
            seq.num_tokens = seq.num_prompt_tokens + seq.max_new_tokens - 1
        self.scheduler.finish(seq)
        self.num_assigned -= 1
        if self.on_finished is not None:
            self.on_finished(seq.request_id)
