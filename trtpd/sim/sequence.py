"""The simulator's sequence: the scheduler's SchedSequence plus the simulator's own bookkeeping."""

from __future__ import annotations

from dataclasses import dataclass

from trtpd.sched.continuous import SchedSequence


@dataclass(eq=False)
class SimSequence(SchedSequence):
    first_step: int = 0        # the decode step in which it generates its first token
    last_step: int = 0         # the step that generates its last token
