"""Admission, one design with two faces: at most `max_inflight` requests served at once and at most `max_queued`
waiting for a slot, exactly, under any burst. A place (a slot, or a queue place) is reserved when the request
is admitted, synchronously, so no number of requests arriving together overshoots either bound; beyond them
the request is refused at once (Overloaded: HTTP 429 with Retry-After at the gateway, Triton UNAVAILABLE in the
stub). Slots pass to waiters in arrival order, and a newcomer never takes a slot a waiter is owed.

The faces differ only in how a queued request waits:
- the gateway's (asyncio, one event loop): `admit()` then `await ticket.enter()`;
- the single server's BLS stub (a thread per request): `Slot.acquire(timeout_s)`, which blocks. There the
  bound protects the python backend's thread pool (trtpd/serving/admission.py says why).
Thread-safe: the stub's threads admit, release and time out concurrently.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable


class Overloaded(Exception):
    """Every slot is taken and the queue is full (or a blocking wait ran out)."""

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class _AsyncWaiter:
    def __init__(self) -> None:
        self.future = asyncio.get_running_loop().create_future()

    @property
    def granted(self) -> bool:
        return self.future.done() and not self.future.cancelled()

    def grant(self) -> None:
        self.future.set_result(None)

    def cancel(self) -> None:
        self.future.cancel()


class _ThreadWaiter:
    def __init__(self) -> None:
        self.event = threading.Event()

    @property
    def granted(self) -> bool:
        return self.event.is_set()

    def grant(self) -> None:
        self.event.set()

    def cancel(self) -> None:
        pass


class Ticket:
    """One request's place: in flight (`waiter` is None or granted) or queued. Released exactly once, however the
    request ends (release is idempotent and thread-safe)."""

    def __init__(self, admission: "Admission", waiter) -> None:
        self.admission = admission
        self.waiter = waiter
        self.released = False

    @property
    def holds_slot(self) -> bool:
        return self.waiter is None or self.waiter.granted

    async def enter(self) -> None:
        """Waits until the ticket holds a slot (at once when it was admitted straight into one). Asyncio face."""
        if self.waiter is not None:
            await asyncio.shield(self.waiter.future)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Blocks until the ticket holds a slot; False when `timeout_s` ran out first. Blocking face."""
        return self.waiter is None or self.waiter.event.wait(timeout_s)

    def release(self) -> None:
        self.admission._leave(self)

    def __del__(self) -> None:   # a response that was never run (the client left at once)
        if not self.released:
            try:
                self.release()
            except RuntimeError:   # its event loop is closed: nothing is left to hand the slot to
                pass


class Admission:
    def __init__(self, max_inflight: int, max_queued: int,
                 on_change: Callable[["Admission"], None] | None = None) -> None:
        if max_inflight < 1 or max_queued < 0:
            raise ValueError(f"admission needs max_inflight >= 1 and max_queued >= 0, got {max_inflight}, {max_queued}")
        self.max_inflight = max_inflight
        self.max_queued = max_queued
        self.num_inflight = 0
        self.waiting: deque[Ticket] = deque()
        self.peak_inflight = 0
        self.peak_queued = 0
        self.num_refused = 0
        self.on_change = on_change or (lambda admission: None)   # the gateway's metrics gauges
        self._lock = threading.RLock()   # re-entrant: a ticket collected (__del__) while this thread holds it

    @property
    def num_queued(self) -> int:
        return len(self.waiting)

    def admit(self) -> Ticket:
        """A slot now, or a place in the queue (then `await ticket.enter()`); Overloaded when the queue is full.
        Asyncio face: call it on the event loop."""
        return self._admit(_AsyncWaiter)

    def admit_blocking(self) -> Ticket:
        """As admit, for a thread (then `ticket.wait(timeout_s)`)."""
        return self._admit(_ThreadWaiter)

    def _admit(self, make_waiter) -> Ticket:
        with self._lock:
            if self.num_inflight < self.max_inflight and not self.waiting:
                self.num_inflight += 1
                self.peak_inflight = max(self.peak_inflight, self.num_inflight)
                ticket = Ticket(self, None)
            elif len(self.waiting) < self.max_queued:
                ticket = Ticket(self, make_waiter())
                self.waiting.append(ticket)
                self.peak_queued = max(self.peak_queued, len(self.waiting))
            else:
                self.num_refused += 1
                raise Overloaded(f"overloaded: {self.num_inflight} requests in flight and {len(self.waiting)} "
                                 f"queued (limits {self.max_inflight} and {self.max_queued}); retry later")
        self.on_change(self)
        return ticket

    def _leave(self, ticket: Ticket) -> None:
        with self._lock:
            if ticket.released:
                return
            ticket.released = True
            if ticket.holds_slot:
                if self.waiting:            # the slot passes to the longest-waiting ticket
                    self.waiting.popleft().waiter.grant()
                else:
                    self.num_inflight -= 1
            else:                           # still queued: its place goes, nobody else is affected
                self.waiting.remove(ticket)
                ticket.waiter.cancel()
        self.on_change(self)

    def refuse_timeout(self, timeout_s: float) -> Overloaded:
        with self._lock:
            self.num_refused += 1
        return Overloaded(f"overloaded: no slot came free in {timeout_s:.0f} s; retry later")
