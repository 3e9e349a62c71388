"""The engine interface: what the engine loop (loop.py) drives and when it calls each method, as vLLM v1's
scheduler interface states its own. The reference engines (prefill_engine.py, decode_engine.py,
colocated_engine.py) implement it; a fake engine in a test implements it too. No attribute is injected:
the loop hands an engine its hooks through `bind`.

Threads: `validate` runs on the caller's thread (the role model's request thread); everything else on the
loop's one engine thread, except `close` (the shell's, after the loop stopped).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from trtpd.engine.request import EngineOutput, EngineRequest


@dataclass(frozen=True)
class EngineHooks:
    """What the loop gives an engine, once, before its thread starts."""

    wakeup: Callable[[], None]                       # wakes the engine thread (any thread may call it: a KV
                                                     # pull finished, an export was released)
    emit: Callable[[list[EngineOutput]], None]       # delivers outputs now, mid-step (engine thread only):
                                                     # prefill's layer-wise handles before its forward pass


class Engine(Protocol):
    def bind(self, hooks: EngineHooks) -> None:
        """Called once by the loop's constructor, before its thread starts."""
        ...

    def validate(self, request: EngineRequest) -> None:
        """Called before the request is submitted, on the submitter's thread: raises RequestError (the
        client's fault, named) or a transfer error; nothing is queued when it raises."""
        ...

    def add(self, request: EngineRequest) -> None:
        """Called on the engine thread when the loop takes a validated request from its inbox; may raise (the
        loop answers that request with an error output)."""
        ...

    def abort(self, request_id: str) -> list[EngineOutput]:
        """Called on the engine thread for a cancelled request (or one whose step failed): drops what the engine
        holds of it; returns its final output if the engine owes one."""
        ...

    def step(self) -> list[EngineOutput]:
        """Called on the engine thread whenever there may be work: schedules and runs one step; returns its
        outputs (an empty list: nothing to do now)."""
        ...

    def has_work(self) -> bool:
        """After a step with no output: whether to step again at once rather than sleep."""
        ...

    def next_wakeup_s(self) -> float | None:
        """When the loop must step again even if nothing arrives (a prefill bucket's deadline, monotonic
        seconds); None: only when woken."""
        ...

    def close(self) -> None:
        """Called by the shell after the loop stopped: ends the engine's threads and its KV exporter/importer."""
        ...
