"""A simulated decode instance: continuous batching with the reference engine's scheduler.

Life of a sequence: prefill done -> `add` (waiting) -> admitted by ContinuousBatchScheduler.schedule()
at a step boundary (GUARANTEED_NO_EVICT reserves its blocks) -> KV pulled over this instance's
ingress link (bytes / bandwidth, FIFO) -> ready -> joins the next step -> generates output_tokens - 1
tokens, one per step (the first came from prefill) -> finished, blocks freed. With the first token at decode, it
goes out at the end of the step the sequence joins, with the token that step generates for it: an engine takes a
pulled request into its batch at a step boundary, and hands its outputs on when the step's pass is done (the
reference engine's step() collects finished pulls, then schedules and runs the pass, and its loop hands on the
step's outputs after it returns, trtpd/engine/loop.py; TensorRT-LLM's executor adds the context phase's first
token to a generation-only request when it schedules it and sends responses once the iteration is done:
tensorrt_llm/_torch/pyexecutor/py_executor.py, _executor_loop, _update_requests after the forward step and then
_handle_responses, read at a recent main commit, not the 1.2 tag). So a pull
that completes during a step waits for that step's end and then for the next step's pass. Traced on the 2-core
reference fleet: the first token went out 15.8 ms after the prefill pass ended for a lone request, 23.5-31.4 ms
for requests that met a burst (benchmarks/validate_sim.py --step-trace).

Steps are simulated one by one (latency from the perf model at the step's batch size and total
context), but no per-sequence work is done per step: a sequence's last step is known when it joins,
and admission calls the scheduler's `admit` (GUARANTEED_NO_EVICT makes a sequence's reserved blocks
stand for its growth, so skipping the per-step allocation changes no decision). With
`exact_steps=True` the whole `schedule()` runs every step, growth included: slower, and used to
check that the fast path makes the same decisions.
"""

from __future__ import annotations

import heapq
from typing import Callable

from trtpd.perf import step_runs
from trtpd.perf.kv_link import kv_transfer_s
from trtpd.perf.model import PerfModel
from trtpd.sched.block_allocator import BlockAllocator
from trtpd.sched.continuous import BatchSchedulerConfig, ContinuousBatchScheduler
from trtpd.sim.events import EventLoop
from trtpd.sim.kv_blocks import BlockCounter
from trtpd.sim.records import RequestRecords
from trtpd.sim.sequence import SimSequence
from trtpd.sim.shared_cores import SharedCores
from trtpd.sim.stepping import SteppingInstance


class KvLink:
    """One FIFO ingress link: transfers queue and each takes latency + bytes / bandwidth."""

    def __init__(self, bytes_per_s: float, latency_s: float) -> None:
        self.bytes_per_s = bytes_per_s
        self.latency_s = latency_s
        self.free_at_s = 0.0
        self.busy_s = 0.0

    def transfer(self, now_s: float, num_bytes: float) -> float:
        start = now_s if now_s > self.free_at_s else self.free_at_s
        duration = kv_transfer_s(num_bytes, self.bytes_per_s, self.latency_s)
        self.busy_s += duration
        self.free_at_s = start + duration
        return self.free_at_s


class DecodeInstance(SteppingInstance):
    def __init__(self, index: int, loop: EventLoop, perf: PerfModel, config: BatchSchedulerConfig,
                 num_blocks: int, tokens_per_block: int, link: KvLink, kv_bytes_per_token: int,
                 records: RequestRecords, first_token_at_decode: bool,
                 on_kv_pulled: Callable[[float, int], None], exact_steps: bool = False,
                 shared: SharedCores | None = None,
                 on_finished: Callable[[int], None] | None = None, inline_steps: bool = True) -> None:
        self.index = index
        self.loop = loop
        self.perf = perf
        allocator = (BlockAllocator if exact_steps else BlockCounter)(num_blocks, tokens_per_block)
        self.scheduler = ContinuousBatchScheduler(config, allocator)
        self.exact_steps = exact_steps
        # decode-only steps (trtpd.sim.stepping); not with shared cores, where other instances' steps change them
        self.inline_steps = inline_steps and not exact_steps and shared is None
        self.horizon_s: Callable[[], float] = loop.next_event_s  # the next event that could reach it
        self.link = link
        self.kv_bytes_per_token = kv_bytes_per_token
        self.records = records
        self.first_token_at_decode = first_token_at_decode
        self.on_kv_pulled = on_kv_pulled   # (now_s, request index): lets prefill free its copy
        self.shared = shared               # cores shared with the other instances (trtpd.sim.shared_cores)
        self.on_finished = on_finished     # (request index): the router releases the request
        # batch -> (context -> step time) for the inline decode-only steps
        self._steps_fn = step_runs.decode_steps_for(perf)
        self.is_stepping = False
        self.num_steps = 0                 # completed steps
        self.num_ready = 0                 # sequences in the current/next step
        self.total_context_tokens = 0      # their context for the next step
        self.joining: list[SimSequence] = []
        self.answering: tuple[int, ...] = ()   # requests whose first token goes out when the step in flight ends
        self.finishing: list[tuple[int, int, SimSequence]] = []   # heap of (last_step, request, seq)
        self.num_assigned = 0              # waiting + running + joining: the router's load signal
        self.busy_s = 0.0
        self.sum_batch_steps = 0           # sum of batch sizes over steps (mean batch = this / steps)

    def add(self, now_s: float, index: int) -> None:
        records = self.records
        seq = SimSequence(index, records.input_tokens[index], records.output_tokens[index], now_s)
        self.scheduler.add(seq)
        self.num_assigned += 1
        if not self.is_stepping:
            self._admit(now_s)

    def _admit(self, now_s: float) -> None:
        if self.exact_steps:   # the whole step, per-step block growth included
            self._exact_plan = plan = self.scheduler.schedule()
            admitted = plan.admitted
        else:                  # the same admission policy; growth is implied by the reservation
            admitted = self.scheduler.admit()
        if admitted:
            transfer_start, transfer_end = self.records.transfer_start_s, self.records.transfer_end_s
            link, per_token, push = self.link, self.kv_bytes_per_token, self.loop.push
            for seq in admitted:
                i = seq.request_id
                transfer_start[i] = now_s
                done_s = link.transfer(now_s, seq.num_prompt_tokens * per_token)
                transfer_end[i] = done_s
                push(done_s, self._kv_ready, seq)

    def _kv_ready(self, now_s: float, seq: SimSequence) -> None:
        i = seq.request_id
        self.on_kv_pulled(now_s, i)
        seq.is_ready = True
        if seq.max_new_tokens <= 1:         # the prefill's token was the only one
            if self.first_token_at_decode:
                self.records.first_token_s[i] = now_s
            self._finish(now_s, seq)
            if not self.is_stepping and self.scheduler.waiting:
                self._admit(now_s)
            return
        self.joining.append(seq)
        if not self.is_stepping:
            self._start_step(now_s)

    def _start_step(self, now_s: float, after_step: bool = False) -> None:
        """after_step: called at the end of a step, after admission was tried (decode-only steps may follow
        inline)."""
        answering = ()
        if self.joining:
            step = self.num_steps + 1
            finishing, push = self.finishing, heapq.heappush
            if self.first_token_at_decode:  # answered when the step it joins is done (the module's docstring)
                answering = tuple(seq.request_id for seq in self.joining)
            for seq in self.joining:
                seq.first_step = step
                seq.last_step = step + seq.max_new_tokens - 2
                self.total_context_tokens += seq.num_prompt_tokens + 1
                push(finishing, (seq.last_step, seq.request_id, seq))
            self.num_ready += len(self.joining)
            self.joining.clear()
        if self.exact_steps:
            self._check_exact_plan(now_s)
        if not self.num_ready:
            self.is_stepping = False
            return
        duration_s = self.perf.decode_step_s(self.num_ready, self.total_context_tokens)
        if answering:
            if self.shared is None:   # the step's end is known now (steps inline after it end later)
                first_token = self.records.first_token_s
                for i in answering:
                    first_token[i] = now_s + duration_s
            else:                     # other instances' steps move its end: answered in _step_done
                self.answering = answering
        self._begin_step(now_s, duration_s, self._steps_fn if after_step else None)

    def _step_done(self, now_s: float, _: object = None) -> None:
        if self.answering:
            first_token = self.records.first_token_s
            for i in self.answering:
                first_token[i] = now_s
            self.answering = ()
        self._end_step(now_s)
        if self.scheduler.waiting and not self.exact_steps:
            self._admit(now_s)
        self._start_step(now_s, after_step=True)

    def _finish(self, now_s: float, seq: SimSequence) -> None:
        records = self.records
        records.done_s[seq.request_id] = now_s
        records.num_done += 1
        if not self.exact_steps:
            seq.num_tokens = seq.num_prompt_tokens + seq.max_new_tokens - 1
        self.scheduler.finish(seq)
        self.num_assigned -= 1
        if self.on_finished is not None:
            self.on_finished(seq.request_id)

    def _check_exact_plan(self, now_s: float) -> None:
        """Exact mode: the unmodified scheduler runs every step and must agree on the batch."""
        self._admit(now_s)
        decode = self._exact_plan.decode
        if len(decode) != self.num_ready:
            raise AssertionError(f"decode {self.index}: scheduler batch {len(decode)} != simulated {self.num_ready}")
