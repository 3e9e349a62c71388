"""The simulator's sequence: the scheduler's SchedSequence plus the simulator's own bookkeeping."""

from __future__ import annotations

from dataclasses import dataclass

from trtpd.sched.continuous import ContinuousBatchScheduler, SchedSequence


@dataclass(eq=False)
class SimSequence(SchedSequence):
    first_step: int = 0        # the decode step in which it generates its first token
    last_step: int = 0         # the step that generates its last token


class DeferredGrowthScheduler(ContinuousBatchScheduler):
    """ContinuousBatchScheduler without the per-step allocation of blocks for generated tokens.

    Admission is decided by the unmodified `schedule()`. Under GUARANTEED_NO_EVICT that decision
    depends only on free - reserved blocks = num_blocks - sum over running of the blocks for
    max_total_tokens, and allocating a reserved block moves it from "reserved" to "used" without
    changing that difference; so skipping the growth changes no decision
    (tests/unit/sim/test_equivalence.py checks it against the unmodified class). It saves the
    simulator a Python call per sequence per step. A sequence's block table holds its prompt blocks;
    the rest of its blocks stay reserved until it finishes (the base class's running sum of reserved
    blocks stays exact, since a reservation no longer changes between admission and finish).
    """

    def _grow(self, seq: SchedSequence) -> None:
        pass
