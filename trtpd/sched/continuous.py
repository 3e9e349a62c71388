"""Continuous (in-flight) batching with TensorRT-LLM's GUARANTEED_NO_EVICT capacity policy.

Used by the decode role (sequences join once their KV has arrived) and by the colocated role
(new prompts are prefilled inside decode steps, within a per-step token budget). A sequence is
admitted only when the blocks for its whole life (prompt + max_new_tokens) can be guaranteed, so a
running sequence is never evicted. Pure: the caller owns time and tensors.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from trtpd.sched.block_allocator import BlockAllocator, num_blocks_for


@dataclass(frozen=True)
class BatchSchedulerConfig:
    max_batch_size: int = 64
    max_num_tokens: int = 8192
    # decode role: admitted sequences receive KV instead of computing, so only max_batch_size binds.
    prefill_in_step: bool = False

    def __post_init__(self) -> None:
        if self.max_batch_size <= 0 or self.max_num_tokens <= 0:
            raise ValueError(f"max_batch_size ({self.max_batch_size}) and max_num_tokens "
                             f"({self.max_num_tokens}) must be positive")


@dataclass(eq=False)   # identity: `seq in running` must not compare field by field
class SchedSequence:
    request_id: str
    num_prompt_tokens: int
    max_new_tokens: int
    arrival_s: float = 0.0
    block_table: list[int] = field(default_factory=list)
    num_tokens: int = 0          # tokens whose KV is (or is being) held: prompt, then + generated
    is_ready: bool = False       # decode role: KV arrived; colocated: prompt prefilled

    @property
    def max_total_tokens(self) -> int:
        return self.num_prompt_tokens + self.max_new_tokens


@dataclass(frozen=True)
class StepPlan:
    admitted: tuple[SchedSequence, ...]   # got blocks this step (prefill now, or start the KV pull)
    decode: tuple[SchedSequence, ...]     # ready sequences that generate one token this step

    @property
    def is_empty(self) -> bool:
        return not self.admitted and not self.decode


class ContinuousBatchScheduler:
    def __init__(self, config: BatchSchedulerConfig, allocator: BlockAllocator) -> None:
        self.config = config
        self.allocator = allocator
        self.waiting: deque[SchedSequence] = deque()
        # admitted sequences in admission order (a dict used as an ordered set: finish is O(1))
        self.running: dict[SchedSequence, None] = {}
        self._num_reserved_blocks = 0   # kept up to date on admit, grow and finish

    @property
    def num_reserved_blocks(self) -> int:
        """Blocks promised to running sequences but not yet allocated."""
        return self._num_reserved_blocks

    def _reservation(self, seq: SchedSequence) -> int:
        return num_blocks_for(seq.max_total_tokens, self.allocator.tokens_per_block) - len(seq.block_table)

    def can_ever_admit(self, seq: SchedSequence) -> bool:
        return num_blocks_for(seq.max_total_tokens, self.allocator.tokens_per_block) <= self.allocator.num_blocks

    def add(self, seq: SchedSequence) -> None:
        if not self.can_ever_admit(seq):
            raise ValueError(f"request {seq.request_id}: {seq.max_total_tokens} tokens need more KV blocks than "
                             f"the cache holds ({self.allocator.num_blocks} x {self.allocator.tokens_per_block})")
        self.waiting.append(seq)

    def _can_admit(self, seq: SchedSequence) -> bool:
        need = num_blocks_for(seq.max_total_tokens, self.allocator.tokens_per_block)
        return self.allocator.num_free_blocks - self.num_reserved_blocks >= need

    def can_admit_next(self) -> bool:
        """Whether the next waiting sequence would be admitted now (ignoring the step token budget)."""
        return (bool(self.waiting) and len(self.running) < self.config.max_batch_size
                and self._can_admit(self.waiting[0]))

    @property
    def num_ready(self) -> int:
        return sum(1 for s in self.running if s.is_ready)

    def schedule(self) -> StepPlan:
        """One step: every ready sequence decodes one token (its block table grows as needed) and
        waiting sequences are admitted in arrival order while they fit."""
        decode = [s for s in self.running if s.is_ready]
        admitted = self.admit(num_decode_rows=len(decode))
        for seq in decode:
            self._grow(seq)
        return StepPlan(admitted, tuple(decode))

    def admit(self, num_decode_rows: int = 0) -> tuple[SchedSequence, ...]:
        """The admission policy alone: FIFO, at most max_batch_size running, blocks for the whole life of
        each sequence guaranteed, and (colocated) prompts within the token budget left by the decode rows.
        Admitted sequences get blocks for their prompt."""
        budget = self.config.max_num_tokens - num_decode_rows
        admitted: list[SchedSequence] = []
        while self.waiting and len(self.running) < self.config.max_batch_size:
            seq = self.waiting[0]
            if self.config.prefill_in_step and seq.num_prompt_tokens > budget:
                break
            if not self._can_admit(seq):
                break
            self.waiting.popleft()
            seq.block_table = self.allocator.allocate(self.allocator.blocks_for(seq.num_prompt_tokens))
            seq.num_tokens = seq.num_prompt_tokens
            self.running[seq] = None
            self._num_reserved_blocks += self._reservation(seq)
            admitted.append(seq)
            if self.config.prefill_in_step:
                budget -= seq.num_prompt_tokens
        return tuple(admitted)

    def _grow(self, seq: SchedSequence) -> None:
        """Makes room for the token this step appends (guaranteed by the reservation)."""
        seq.num_tokens += 1
        need = self.allocator.blocks_for(seq.num_tokens) - len(seq.block_table)
        if need > 0:
            seq.block_table.extend(self.allocator.allocate(need))
            self._num_reserved_blocks -= need

    def finish(self, seq: SchedSequence) -> None:
        """Frees a sequence's blocks, whether it finished, was cancelled or failed."""
        if seq in self.running:
            del self.running[seq]
            self._num_reserved_blocks -= self._reservation(seq)
            self.allocator.free(seq.block_table)
            seq.block_table = []
        elif seq in self.waiting:
            self.waiting.remove(seq)
