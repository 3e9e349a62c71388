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

from trtpd.admission import Admission, Overloaded, Ticket   # noqa: F401 - the one design (trtpd/admission.py)


class Slot:
    """One request's hold on an admission slot, for the BLS's per-request thread: `acquire` blocks in the queue
    (Overloaded at once when it is full, or when no slot came free within `timeout_s`); `release` is idempotent
    and thread-safe, so the job's thread and the stub watch may both call it."""

    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self._ticket: Ticket | None = None

    def acquire(self, timeout_s: float | None = None) -> None:
        ticket = self._admission.admit_blocking()
        if not ticket.wait(timeout_s):
            ticket.release()             # its queue place goes (or, granted just then, the slot passes on)
            raise self._admission.refuse_timeout(timeout_s)
        self._ticket = ticket

    def release(self) -> None:
        if self._ticket is not None:
            self._ticket.release()
