"""What the decode and colocated instances share: one decode step after another, each sequence's
last step known when it joins (a heap of (last_step, request, sequence)), and step bookkeeping."""

from __future__ import annotations

import heapq


class SteppingInstance:
    """Mixin; the instance provides loop, num_steps, num_ready, total_context_tokens, finishing,
    busy_s, sum_batch_steps, is_stepping, _step_done and _finish."""

    def _begin_step(self, now_s: float, duration_s: float) -> None:
        self.busy_s += duration_s
        self.sum_batch_steps += self.num_ready
        self.is_stepping = True
        self.loop.push(now_s + duration_s, self._step_done)

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
