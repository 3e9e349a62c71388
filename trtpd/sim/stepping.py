"""What the decode and colocated instances share: one decode step after another, each sequence's
last step known when it joins (a heap of (last_step, request, sequence)), and step bookkeeping.

Decode-only steps run inline. A step that computes no prompt, ends before any sequence's last step
and before the instance's horizon (the next event that could reach it: `horizon_s`, by default the
loop's next event of any kind) changes nothing but the instance's counters: nothing reaches the
instance in between, the admission tried at the step's start would try the same state at its end,
so the next step is decode-only too. Such step ends are counted here, one after another, without
the event heap; the first one that is not (a sequence finishes, or the horizon comes first) goes
through the heap as usual. The timestamps are the same floats (each end is the previous end + its
duration, as through the heap) and `num_events` counts every step. Events of other instances that
cannot reach this one (a colocated peer's steps) may run after these steps in wall-clock order; they
read nothing of this instance, so the run is the same.
"""

from __future__ import annotations

import heapq
from typing import Callable

from trtpd.perf.step_runs import DecodeSteps
from trtpd.sim.shared_cores import SharedCores


class SteppingInstance:
    """Mixin; the instance provides loop, num_steps, num_ready, total_context_tokens, finishing,
    busy_s, sum_batch_steps, is_stepping, inline_steps, horizon_s, shared, _step_done and _finish.
    With `shared` cores (trtpd.sim.shared_cores) they time each step, and no step runs inline (the other
    instances' steps move its end)."""

    shared: SharedCores | None = None

    def _begin_step(self, now_s: float, duration_s: float,
                    decode_steps: Callable[[int], DecodeSteps] | None = None, prompt_pass: bool = False) -> None:
        """decode_steps: given for a decode-only step begun at the end of the previous one (so that
        admission was tried at its start): batch -> the run of decode steps at that batch
        (trtpd.perf.step_runs), to run the following decode-only steps inline. prompt_pass: the step computes
        prompts (trtpd.sim.shared_cores: it runs its whole pass without a break)."""
        self.busy_s += duration_s
        self.sum_batch_steps += self.num_ready
        self.is_stepping = True
        if self.shared is not None:
            self.shared.run(self, now_s, duration_s, self._step_done, None, self.num_ready / duration_s
                            if duration_s > 0 else 0.0, prompt_pass=prompt_pass)
            return
        end_s = now_s + duration_s
        if decode_steps is not None and self.inline_steps:
            end_s = self._run_decode_only_steps(end_s, decode_steps)
        self.loop.push(end_s, self._step_done)

    def _run_decode_only_steps(self, end_s: float, decode_steps: Callable[[int], DecodeSteps]) -> float:
        """Ends the decode-only step that ends at end_s and starts the next, while that step end is
        before every other event and finishes no sequence; returns the end of the step the heap gets."""
        next_s = self.horizon_s()              # nothing is pushed while these steps run
        if not end_s < next_s:
            return end_s
        num_ready = self.num_ready
        # step ends that finish no sequence: up to the one before the first sequence's last step
        limit = self.finishing[0][0] - self.num_steps - 1   # num_ready > 0: someone is in the heap
        if limit <= 0:
            return end_s
        n, context, end_s, busy_s = decode_steps(num_ready)(self.total_context_tokens, end_s, self.busy_s, next_s,
                                                            limit)
        if n:
            self.num_steps += n
            self.total_context_tokens, self.busy_s = context, busy_s
            self.sum_batch_steps += n * num_ready
            self.loop.num_inline_events += n
        return end_s

    def _end_step(self, now_s: float) -> None:
        """Counts the step and finishes the sequences whose last token it produced."""
        self.num_steps += 1
        self.total_context_tokens += self.num_ready
        finishing = self.finishing
        while finishing and finishing[0][0] == self.num_steps:
            seq = heapq.heappop(finishing)[2]
            self.num_ready -= 1
            self.total_context_tokens -= seq.num_prompt_tokens + seq.max_new_tokens
            self._finish(now_s, seq)
