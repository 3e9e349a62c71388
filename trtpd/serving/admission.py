"""Admission in front of the role models: bursts queue in the orchestrator, they do not deadlock it.

Why. Each BLS sub-request holds one thread of the python backend's pool (32 threads per stub in
Triton 2.51, shared with the stub's response sends) until its first response arrives. A prefill
sub-request waiting for KV blocks therefore holds a thread; the blocks it waits for are freed when
decode pulls the KV of requests already prefilled; and those decode sub-requests need threads of
the same pool. With 200 requests at once every thread was taken by waiting prefill sub-requests,
no decode sub-request ran, and every export expired.

The rule. A request passes through `Admission`: it may wait in a bounded queue (beyond it: the
explicit "overloaded, retry" error), and it holds one of `max_inflight` slots from before its
prefill sub-request until its decode sub-request has answered (the KV is pulled by then). So at
most `max_inflight` sub-requests wait on a pool thread at once, fewer than the pool has, and at most
`max_inflight` prefilled KV exports wait for decode: nothing prefilled waits on a thread that only a
later request could free, and no export expires for a request that was never served.
"""

from __future__ import annotations

import threading
import time


class OverloadedError(Exception):
    """The orchestrator's queue is full: the client should retry later (Triton UNAVAILABLE)."""


class Admission:
    def __init__(self, max_inflight: int, max_queued: int) -> None:
        if max_inflight < 1 or max_queued < 0:
            raise ValueError(f"admission needs max_inflight >= 1 and max_queued >= 0, got {max_inflight}, {max_queued}")
        self.max_inflight = max_inflight
        self.max_queued = max_queued
        self._cond = threading.Condition()
        self.num_inflight = 0
        self.num_queued = 0
        self.num_refused = 0

    def enter(self, timeout_s: float | None = None) -> None:
        """Waits for a slot; raises OverloadedError at once when the queue is full, or when no slot
        came free within `timeout_s`."""
        with self._cond:
            if self.num_inflight >= self.max_inflight and self.num_queued >= self.max_queued:
                self.num_refused += 1
                raise OverloadedError(f"overloaded: {self.num_inflight} requests in flight and {self.num_queued} "
                                      f"queued (limit {self.max_queued}); retry later")
            self.num_queued += 1
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            try:
                while self.num_inflight >= self.max_inflight:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        self.num_refused += 1
                        raise OverloadedError(f"overloaded: no slot came free in {timeout_s:.0f} s; retry later")
                    self._cond.wait(remaining)
            finally:
                self.num_queued -= 1
            self.num_inflight += 1

    def leave(self) -> None:
        with self._cond:
            if self.num_inflight <= 0:
                raise RuntimeError("Admission.leave without a matching enter")
            self.num_inflight -= 1
            self._cond.notify()


class Slot:
    """One request's hold on an admission slot; `release` is idempotent, so every exit path may call it."""

    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self._held = False

    def acquire(self, timeout_s: float | None = None) -> None:
        self._admission.enter(timeout_s)
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._admission.leave()
