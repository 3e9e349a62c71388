"""A simulated colocated instance: one engine runs both phases, under one of three step policies.

- `inflight`: TensorRT-LLM in-flight batching without chunked context. At each step boundary waiting
  prompts join whole, within the step's token budget (max_num_tokens, decode rows counted first); the
  step covers the prompts and the running sequences' decode, so every running sequence waits for the
  longer mixed step.
- `chunked`: TensorRT-LLM in-flight batching with chunked context (enable_chunked_context). Each step
  has a token budget (max_num_tokens): one token for every decoding sequence first, then prompt
  chunks, oldest prompt first, up to the budget. A prompt longer than what is left continues in the
  next step; its first token comes out with its last chunk. A chunk of c tokens after k computed ones
  costs attention as c^2 + 2ck squared tokens (the causal rows it adds).
- `prefill_first`: vLLM 0.2's scheduler (DistServe's baseline). When a waiting prompt can be
  admitted, the next step is a prefill-only step over the waiting prompts (whole, up to
  max_num_tokens) and every running sequence pauses for it; otherwise a decode step.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections import deque
from dataclasses import replace
from typing import Callable, Literal

from trtpd.perf import step_runs
from trtpd.perf.model import PerfModel
from trtpd.sched.block_allocator import BlockAllocator
from trtpd.sched.continuous import BatchSchedulerConfig, ContinuousBatchScheduler
from trtpd.sim.events import EventLoop
from trtpd.sim.kv_blocks import BlockCounter
from trtpd.sim.records import RequestRecords
from trtpd.sim.sequence import SimSequence
from trtpd.sim.shared_cores import SharedCores
from trtpd.sim.stepping import SteppingInstance

ColocatedPolicy = Literal["inflight", "chunked", "prefill_first"]
COLOCATED_POLICIES: tuple[str, ...] = ("inflight", "chunked", "prefill_first")


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
                 on_finished: Callable[[int], None] | None = None, policy: ColocatedPolicy = "inflight",
                 inline_steps: bool = True, shared: SharedCores | None = None) -> None:
        if not config.prefill_in_step:
            raise ValueError("a colocated instance needs BatchSchedulerConfig(prefill_in_step=True)")
        if policy not in COLOCATED_POLICIES:
            raise ValueError(f"colocated policy {policy!r}: use one of {', '.join(COLOCATED_POLICIES)}")
        self.index = index
        self.loop = loop
        self.perf = perf
        mixed = getattr(perf, "mixed_step_s", None)   # what mixed_step_s(perf, ...) calls, looked up once
        self._step_s: Callable[[int, int, int, int], float] = (
            mixed if mixed is not None else functools.partial(mixed_step_s, perf))
        # runs of decode-only steps, and of chunked steps that give one prompt the whole budget (trtpd.perf.step_runs)
        self._decode_steps = step_runs.decode_steps_for(perf)
        self._chunk_steps = step_runs.chunk_steps_for(perf, self._step_s)
        self.policy = policy
        self.token_budget = config.max_num_tokens
        allocator = (BlockAllocator if exact_steps else BlockCounter)(num_blocks, tokens_per_block)
        # chunked: admission is bounded by batch slots and KV only; the instance splits prompts into chunks
        sched_config = replace(config, prefill_in_step=False) if policy == "chunked" else config
        self.scheduler = ContinuousBatchScheduler(sched_config, allocator)
        self.exact_steps = exact_steps
        # decode-only and chunk steps run inline (trtpd.sim.stepping); not with shared cores, where the peers' steps
        # change them
        self.inline_steps = inline_steps and not exact_steps and shared is None
        self.shared = shared               # cores shared with the other instances (trtpd.sim.shared_cores)
        self.horizon_s: Callable[[], float] = loop.next_event_s  # the next event that could reach it
        # chunked, inline chunk steps: True where only arrivals reach the instance (horizon_s = the next
        # arrival; see _run_chunk_steps)
        self.late_admission = False
        # what the last inline run did that may pass horizon_s, for rewind_to: (0, step end, num_steps, busy_s,
        # sum_batch_steps before it) or (1, the chunk-step run and its arguments and counters, its step ends)
        self.steps_ahead: list[tuple] = []
        self.records = records
        self.on_prefilled = on_prefilled   # (request index): its prompt left the queue (the router is told)
        self.on_finished = on_finished     # (request index): the router releases the request
        self.is_stepping = False
        self.num_steps = 0                 # decode steps (a prefill-only step is not one)
        self.num_ready = 0
        self.total_context_tokens = 0
        self.prefilling: tuple[SimSequence, ...] = ()      # prompts whose (last) chunk this step computes
        self.chunking: deque[SimSequence] = deque()        # chunked: admitted, prompt not fully computed
        self.num_computed: dict[int, int] = {}             # chunked: prompt tokens computed, by request
        self.step_chunks: list[tuple[SimSequence, int]] = []
        self.is_prefill_only = False
        self.finishing: list[tuple[int, int, SimSequence]] = []
        self.num_assigned = 0
        self.queued_tokens = 0
        self.busy_s = 0.0
        self.sum_batch_steps = 0

    @property
    def max_prompt_tokens(self) -> int | None:
        """The longest prompt a step can take (None: any, chunked prompts span steps)."""
        return None if self.policy == "chunked" else self.token_budget

    def add(self, now_s: float, index: int) -> None:
        records = self.records
        seq = SimSequence(index, records.input_tokens[index], records.output_tokens[index], now_s)
        self.scheduler.add(seq)
        self.num_assigned += 1
        self.queued_tokens += seq.num_prompt_tokens
        if not self.is_stepping:
            self._start_step(now_s)

    # -- step starts -------------------------------------------------------------------------------
    def _start_step(self, now_s: float, after_step: bool = False) -> None:
        """after_step: called at the end of a step (decode-only steps may follow inline)."""
        if self.policy == "chunked":
            self._start_chunked_step(now_s, after_step)
        elif self.policy == "prefill_first" and self.scheduler.can_admit_next():
            self._start_prefill_only_step(now_s)
        else:
            self._start_mixed_step(now_s, after_step)

    def _admit(self, num_decode_rows: int) -> tuple[SimSequence, ...]:
        if self.exact_steps:
            plan = self.scheduler.schedule()
            if len(plan.decode) != self.num_ready:
                raise AssertionError(f"colocated {self.index}: scheduler batch {len(plan.decode)} != {self.num_ready}")
            return plan.admitted  # type: ignore[return-value]
        if self.scheduler.waiting:
            return self.scheduler.admit(num_decode_rows=num_decode_rows)  # type: ignore[return-value]
        return ()

    def _start_mixed_step(self, now_s: float, after_step: bool = False) -> None:
        """inflight (and prefill_first's decode steps, which admit nothing): whole prompts join the step."""
        admitted = self._admit(self.num_ready) if self.policy == "inflight" else self._decode_only_plan()
        prefill_tokens = sum_sq = 0
        prefill_start = self.records.prefill_start_s
        for seq in admitted:
            n = seq.num_prompt_tokens
            prefill_tokens += n
            sum_sq += n * n
            prefill_start[seq.request_id] = now_s
        self.prefilling = admitted
        self.is_prefill_only = False
        if not admitted and not self.num_ready:
            self.is_stepping = False
            return
        duration_s = self._step_s(prefill_tokens, sum_sq, self.num_ready, self.total_context_tokens)
        self._begin_step(now_s, duration_s, self._decode_steps if after_step and not admitted else None,
                         prompt_pass=bool(admitted))

    def _decode_only_plan(self) -> tuple[SimSequence, ...]:
        if self.exact_steps and self.num_ready:
            plan = self.scheduler.schedule()     # nothing admissible (checked): decode rows grow only
            assert not plan.admitted
        return ()

    def _start_prefill_only_step(self, now_s: float) -> None:
        admitted: tuple[SimSequence, ...] = self.scheduler.admit(num_decode_rows=0)  # type: ignore[assignment]
        if not admitted:   # the head prompt does not fit the token budget alone (refused on arrival)
            self._start_mixed_step(now_s)
            return
        prefill_tokens = sum_sq = 0
        for seq in admitted:
            n = seq.num_prompt_tokens
            prefill_tokens += n
            sum_sq += n * n
            self.records.prefill_start_s[seq.request_id] = now_s
        self.prefilling = admitted
        self.is_prefill_only = True
        duration_s = self.perf.prefill_s(prefill_tokens, sum_sq)
        self.busy_s += duration_s
        self.is_stepping = True
        if self.shared is not None:
            self.shared.run(self, now_s, duration_s, self._step_done, prompt_pass=True)
        else:
            self.loop.push(now_s + duration_s, self._step_done)

    def _start_chunked_step(self, now_s: float, after_step: bool = False) -> None:
        duration_s = self._plan_chunked_step(now_s)
        if duration_s is None:
            self.is_stepping = False
            return
        chunks = self.step_chunks
        if chunks and self.inline_steps:
            self.busy_s += duration_s          # as _begin_step
            self.sum_batch_steps += self.num_ready
            self.is_stepping = True
            end_s = now_s + duration_s
            if len(chunks) == 1:               # else this step completes a prompt (_run_chunk_steps's first test)
                end_s = self._run_chunk_steps(end_s)
            self.loop.push(end_s, self._step_done)
            return
        self._begin_step(now_s, duration_s, self._decode_steps if after_step and not self.step_chunks else None,
                         prompt_pass=bool(self.step_chunks))

    def _run_chunk_steps(self, end_s: float) -> float:
        """Chunked: ends the step that ends at end_s and starts the next, inline, while that step end is before
        every other event that could reach this instance (horizon_s) and completes no prompt and finishes no
        sequence: the step computes one chunk that leaves the head prompt unfinished. Such a step end changes
        this instance's counters only (what _step_done then does: _end_step with no one finishing, the chunk
        counted, no prompt done); the next step starts as _start_chunked_step starts it (admission included,
        at the same state and time). Returns the end of the step the heap gets.

        With late_admission (only arrivals reach the instance), a step end at or after the next arrival is run
        inline too when the step it starts gives the head prompt the whole token budget: such a step is the
        same whatever arrived, since a prompt admitted at its start would get no chunk, and admission (FIFO,
        bounded by batch slots and by free blocks less reserved ones, which decode growth does not change)
        admits the same prompts at the step end the heap gets. The router reads nothing these steps change.
        steps_ahead keeps what rewind_to needs if the run ends early (overloaded)."""
        next_s = self.horizon_s()              # nothing is pushed while these steps run
        num_computed, finishing = self.num_computed, self.finishing
        late_admission = self.late_admission
        ahead = self.steps_ahead
        ahead.clear()
        waiting = self.scheduler.waiting
        n = 0
        while True:
            chunks = self.step_chunks
            if len(chunks) != 1:
                break
            seq, c = chunks[0]
            done = num_computed[seq.request_id] + c
            if done == seq.num_prompt_tokens or (finishing and finishing[0][0] == self.num_steps + 1):
                break
            if not end_s < next_s:             # a request may reach this instance before end_s
                budget = self.token_budget - self.num_ready
                if not (late_admission and 0 < budget <= seq.num_prompt_tokens - done):
                    break
                ahead.append((0, end_s, self.num_steps, self.busy_s, self.sum_batch_steps))
            self.num_steps += 1                # the step ending at end_s (as _step_done)
            self.total_context_tokens += self.num_ready
            num_computed[seq.request_id] = done
            n += 1
            now_s = end_s
            budget = self.token_budget - self.num_ready
            if not waiting and 0 < budget <= seq.num_prompt_tokens - done:
                end_s, k = self._run_head_chunks(seq, done, budget, now_s, next_s)
                n += k
                continue
            duration_s = self._plan_chunked_step(now_s)   # the next step (as _start_chunked_step)
            assert duration_s is not None      # the head prompt is still chunking
            self.busy_s += duration_s
            self.sum_batch_steps += self.num_ready
            end_s = now_s + duration_s
            if not self.step_chunks:           # decode-only (no budget left): as _begin_step after a step
                end_s = self._run_decode_only_steps(end_s, self._decode_steps)
                break
        self.loop.num_inline_events += n
        return end_s

    def _run_head_chunks(self, seq: SimSequence, done: int, budget: int, now_s: float,
                         next_s: float) -> tuple[float, int]:
        """_run_chunk_steps's common case, on local variables: nothing waits to be admitted and the step
        starting at now_s gives the head prompt (done tokens computed) the whole budget, as _plan_chunked_step
        would plan it. Plans that step and the ones after it while each step end leaves the next one the
        same kind: it completes no prompt, finishes no sequence, and the head still has a budget's worth
        left; before next_s, or past it with late_admission. Returns the end of the last step planned
        (its end not run) and how many step ends were run."""
        num_ready = self.num_ready
        # step ends to run: none that finishes a sequence (the first sequence's last step), and after each the
        # head keeps at least a budget's worth (so the next step gives it the whole budget)
        limit = (seq.num_prompt_tokens - done) // budget - 1
        if self.finishing:
            limit = min(limit, self.finishing[0][0] - self.num_steps - 1)
        run = self._chunk_steps(budget, num_ready)
        context, busy_s = self.total_context_tokens, self.busy_s
        k, done_after, context, end_s, busy_s = run(done, context, now_s, busy_s,
                                                   math.inf if self.late_admission else next_s, limit)
        if self.late_admission and k:          # its step ends may pass next_s: rewind_to runs it again
            self.steps_ahead.append((1, run, done, self.total_context_tokens, now_s, self.busy_s,
                                     self.sum_batch_steps, self.num_steps, num_ready, k))
        self.num_steps += k
        self.total_context_tokens, self.busy_s = context, busy_s
        self.sum_batch_steps += (k + 1) * num_ready
        self.num_computed[seq.request_id] = done_after
        self.step_chunks = [(seq, budget)]
        return end_s, k

    def rewind_to(self, now_s: float) -> None:
        """A run that ends at now_s before its last events (overloaded): forgets the inline steps begun at or
        after now_s, so that the counters say what had happened by then, as with no step run ahead."""
        for entry in self.steps_ahead:         # in the order they ran
            if entry[0] == 0:                  # a step end: the counters before it
                _, boundary_s, num_steps, busy_s, sum_batch_steps = entry
                if boundary_s < now_s:
                    continue
            else:                              # a run of chunk steps (_run_head_chunks), run again to now_s
                _, run, done, context, start_s, busy_s, sum_batch_steps, num_steps, num_ready, k = entry
                k_before, _, _, _, busy_s = run(done, context, start_s, busy_s, now_s, k)
                if k_before == k:              # every step end it ran is before now_s
                    continue
                num_steps += k_before
                sum_batch_steps += (k_before + 1) * num_ready
            self.loop.num_inline_events -= self.num_steps - num_steps
            self.num_steps, self.busy_s, self.sum_batch_steps = num_steps, busy_s, sum_batch_steps
            break
        self.steps_ahead.clear()

    def _plan_chunked_step(self, now_s: float) -> float | None:
        """Admits, picks the step's chunks (step_chunks) and returns its duration; None: nothing to step."""
        for seq in self._admit(self.num_ready):
            self.chunking.append(seq)
            self.num_computed[seq.request_id] = 0
        budget = self.token_budget - self.num_ready
        chunks: list[tuple[SimSequence, int]] = []
        prefill_tokens = sum_sq = 0
        for seq in self.chunking:
            if budget <= 0:
                break
            done = self.num_computed[seq.request_id]
            c = min(seq.num_prompt_tokens - done, budget)
            if done == 0:
                self.records.prefill_start_s[seq.request_id] = now_s
            chunks.append((seq, c))
            prefill_tokens += c
            sum_sq += c * c + 2 * c * done
            budget -= c
        self.step_chunks = chunks
        self.is_prefill_only = False
        if not chunks and not self.num_ready:
            return None
        return self._step_s(prefill_tokens, sum_sq, self.num_ready, self.total_context_tokens)

    # -- step ends ---------------------------------------------------------------------------------
    def _step_done(self, now_s: float, _: object = None) -> None:
        finishing = self.finishing
        if not (self.step_chunks or self.prefilling or self.chunking or self.scheduler.waiting or self.is_prefill_only
                or finishing[0][0] == self.num_steps + 1):
            # a decode-only step that finishes no one, nothing to admit (an arrival went elsewhere): what the
            # rest does then (_end_step, no prompt done, a decode-only step planned by any policy), shortly
            self.num_steps += 1
            self.total_context_tokens += self.num_ready
            self._begin_step(now_s, self.perf.decode_step_s(self.num_ready, self.total_context_tokens),
                             self._decode_steps)
            return
        if not self.is_prefill_only:
            self._end_step(now_s)
        if self.policy == "chunked":
            finished = []
            for seq, c in self.step_chunks:
                i = seq.request_id
                self.num_computed[i] += c
                if self.num_computed[i] == seq.num_prompt_tokens:
                    del self.num_computed[i]
                    finished.append(seq)
            for _seq in finished:
                self.chunking.popleft()     # chunks go oldest first: the finished ones lead the queue
            self.step_chunks = []
            self.prefilling = tuple(finished)
        self._prompts_done(now_s)
        self._start_step(now_s, after_step=True)

    def _prompts_done(self, now_s: float) -> None:
        records = self.records
        for seq in self.prefilling:       # prompts completed in this step: first token out now
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

    def _finish(self, now_s: float, seq: SimSequence) -> None:
        self.records.done_s[seq.request_id] = now_s
        self.records.num_done += 1
        if not self.exact_steps:
            seq.num_tokens = seq.num_prompt_tokens + seq.max_new_tokens - 1
        self.scheduler.finish(seq)
        self.num_assigned -= 1
        if self.on_finished is not None:
            self.on_finished(seq.request_id)
