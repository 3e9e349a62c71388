"""Admission: at most `max_inflight` requests served at once and at most `max_queued` waiting for a slot,
exactly, under any burst. A place is reserved when the request is admitted (synchronously, on the event
loop, before the handler awaits anything), so no number of requests arriving together can overshoot either
bound; beyond them the request is refused at once (HTTP 429 with Retry-After). Slots pass to waiters in
arrival order.
"""

from __future__ import annotations

import asyncio
from collections import deque


class Overloaded(Exception):
    """Every slot is taken and the queue is full."""

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Ticket:
    """One request's place: in flight (`future` is None or done) or queued (waiting on `future`). Released
    exactly once, however the request ends."""

    def __init__(self, admission: "Admission", future: asyncio.Future | None) -> None:
        self.admission = admission
        self.future = future
        self.released = False

    async def enter(self) -> None:
        """Waits until the ticket holds a slot (at once when it was admitted straight into one)."""
        if self.future is not None:
            await asyncio.shield(self.future)

    @property
    def holds_slot(self) -> bool:
        return self.future is None or (self.future.done() and not self.future.cancelled())

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        self.admission._leave(self)

    def __del__(self) -> None:   # a response that was never run (the client left at once)
        if not self.released:
            try:
                self.release()
            except RuntimeError:   # its event loop is closed: nothing is left to hand the slot to
                pass


class Admission:
    def __init__(self, max_inflight: int, max_queued: int, on_change=None) -> None:
        if max_inflight < 1 or max_queued < 0:
            raise ValueError(f"admission needs max_inflight >= 1 and max_queued >= 0, got {max_inflight}, {max_queued}")
        self.max_inflight = max_inflight
        self.max_queued = max_queued
        self.num_inflight = 0
        self.waiting: deque[Ticket] = deque()
        self.peak_inflight = 0
        self.peak_queued = 0
        self.num_refused = 0
        self.on_change = on_change or (lambda admission: None)   # the metrics gauges

    @property
    def num_queued(self) -> int:
        return len(self.waiting)

    def admit(self) -> Ticket:
        """A slot now, or a place in the queue; Overloaded when the queue is full."""
        if self.num_inflight < self.max_inflight and not self.waiting:
            self.num_inflight += 1
            self.peak_inflight = max(self.peak_inflight, self.num_inflight)
            ticket = Ticket(self, None)
        elif len(self.waiting) < self.max_queued:
            ticket = Ticket(self, asyncio.get_running_loop().create_future())
            self.waiting.append(ticket)
            self.peak_queued = max(self.peak_queued, len(self.waiting))
        else:
            self.num_refused += 1
            raise Overloaded(f"overloaded: {self.num_inflight} requests in flight and {len(self.waiting)} queued "
                             f"(limits {self.max_inflight} and {self.max_queued}); retry later")
        self.on_change(self)
        return ticket

    def _leave(self, ticket: Ticket) -> None:
        if ticket.holds_slot:
            self._hand_on()
        else:   # still queued: its place goes, nobody else is affected
            self.waiting.remove(ticket)
            ticket.future.cancel()
        self.on_change(self)

    def _hand_on(self) -> None:
        """A slot came free: the longest-waiting ticket gets it, else the count drops."""
        if self.waiting:
            self.waiting.popleft().future.set_result(None)
        else:
            self.num_inflight -= 1
