"""The event loop: a heap of (time, sequence number, handler, argument). No simpy."""

from __future__ import annotations

import heapq
import itertools
import math
from typing import Any, Callable

Handler = Callable[[float, Any], None]


class EventLoop:
    def __init__(self) -> None:
        self.heap: list[tuple[float, int, Handler, Any]] = []
        self._counter = itertools.count()
        self.now_s = 0.0
        self.num_events = 0
        self.num_inline_events = 0      # run by a handler itself (SteppingInstance), counted at the end of run
        self._arrivals: list[float] = []
        self._next_arrival = 0          # index of the next arrival not yet handled
        self._on_arrival: Handler | None = None
        self._stop_requested = False
        self._num_paused_events = 0     # handled before a stop, counted when the run ends

    def push(self, time_s: float, handler: Handler, arg: Any = None) -> None:
        heapq.heappush(self.heap, (time_s, next(self._counter), handler, arg))

    def next_event_s(self) -> float:
        """Time of the next event waiting (in the heap or the next arrival); inf when none. An event a
        handler runs itself before this time (SteppingInstance's decode-only steps) is one that the loop
        would have run next."""
        i, arrivals, heap = self._next_arrival, self._arrivals, self.heap
        t = arrivals[i] if i < len(arrivals) else math.inf
        return heap[0][0] if heap and heap[0][0] < t else t

    def next_arrival_s(self) -> float:
        """Time of the next arrival not yet handled; inf when none."""
        i, arrivals = self._next_arrival, self._arrivals
        return arrivals[i] if i < len(arrivals) else math.inf

    def request_stop(self) -> None:
        """Stops run() after the event being handled; run() again goes on from there."""
        self._stop_requested = True

    def run(self, arrival_s: list[float] | None = None, on_arrival: Handler | None = None) -> bool:
        """Runs until no event is left (True) or a handler called request_stop() (False; call run() with no
        arguments to go on). Arrivals (sorted times, handler called with the index) are merged in without
        going through the heap; an arrival goes before other events at the same time."""
        if arrival_s is not None or on_arrival is not None:
            self._arrivals, self._on_arrival, self._next_arrival = arrival_s or [], on_arrival, 0
        heap, pop = self.heap, heapq.heappop
        arrivals, on_arrival = self._arrivals, self._on_arrival
        num_arrivals, i, n = len(arrivals), self._next_arrival, 0
        self._stop_requested = False
        while not self._stop_requested:
            if i < num_arrivals and (not heap or arrivals[i] <= heap[0][0]):
                self.now_s = time_s = arrivals[i]
                self._next_arrival = i + 1
                on_arrival(time_s, i)  # type: ignore[misc]
                i += 1
            elif heap:
                time_s, _, handler, arg = pop(heap)
                self.now_s = time_s
                handler(time_s, arg)
            else:
                self.num_events += self._num_paused_events + n + self.num_inline_events
                self._num_paused_events = self.num_inline_events = 0
                return True
            n += 1
        self._num_paused_events += n      # counted once the run ends (an exception loses them, as it loses n)
        return False
