"""The simulator's sequence: the scheduler's SchedSequence plus the simulator's own bookkeeping.

Equality is identity. SchedSequence is a dataclass with field-wise __eq__, which makes the
scheduler's `seq in self.running` / `running.remove(seq)` build and compare field tuples for
every element; two distinct sequences are never the same sequence, so identity is also the
correct meaning.
"""

from __future__ import annotations

from dataclasses import dataclass

from trtpd.sched.continuous import ContinuousBatchScheduler, SchedSequence


@dataclass(eq=False)
class SimSequence(SchedSequence):
    first_step: int = 0        # the decode step in which it generates its first token
    last_step: int = 0         # the step that generates its last token

    __eq__ = object.__eq__
    __hash__ = object.__hash__


class _RunningList(list):
    """The scheduler's `running` list, keeping the sum of its sequences' reserved blocks up to date.

    With growth deferred, a running sequence's reservation (blocks for max_total_tokens minus the
    blocks it holds) is fixed from admission to finish, so a sum updated on append/remove equals
    what ContinuousBatchScheduler.num_reserved_blocks recomputes over the whole list.
    """

    def __init__(self, tokens_per_block: int) -> None:
        super().__init__()
        self.tokens_per_block = tokens_per_block
        self.num_reserved_blocks = 0

    def _reserved(self, seq: SchedSequence) -> int:
        return -(-seq.max_total_tokens // self.tokens_per_block) - len(seq.block_table)

    def append(self, seq: SchedSequence) -> None:
        super().append(seq)
        self.num_reserved_blocks += self._reserved(seq)

    def remove(self, seq: SchedSequence) -> None:
        super().remove(seq)
        self.num_reserved_blocks -= self._reserved(seq)


class DeferredGrowthScheduler(ContinuousBatchScheduler):
    """ContinuousBatchScheduler without the per-step allocation of blocks for generated tokens.

    Admission is decided by the unmodified `schedule()`. Under GUARANTEED_NO_EVICT that decision
    depends only on free - reserved blocks = num_blocks - sum over running of the blocks for
    max_total_tokens, and allocating a reserved block moves it from "reserved" to "used" without
    changing that difference; so skipping the growth changes no decision
    (tests/unit/sim/test_equivalence.py checks it against the unmodified class). It saves the
    simulator a Python call per sequence per step. A sequence's block table holds its prompt blocks;
    the rest of its blocks stay reserved until it finishes. The reserved-block count is kept as a
    running sum instead of being recomputed over all running sequences at every admission.
    """

    def __init__(self, config, allocator) -> None:
        super().__init__(config, allocator)
        self.running = _RunningList(allocator.tokens_per_block)

    @property
    def num_reserved_blocks(self) -> int:
        return self.running.num_reserved_blocks

    def _grow(self, seq: SchedSequence) -> None:
        pass
