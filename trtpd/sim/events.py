"""The event loop: a heap of (time, sequence number, handler, argument). No simpy."""

from __future__ import annotations

import heapq
import itertools
from typing import Any, Callable

Handler = Callable[[float, Any], None]


class EventLoop:
    def __init__(self) -> None:
        self.heap: list[tuple[float, int, Handler, Any]] = []
        self._counter = itertools.count()
        self.now_s = 0.0
        self.num_events = 0

    def push(self, time_s: float, handler: Handler, arg: Any = None) -> None:
        heapq.heappush(self.heap, (time_s, next(self._counter), handler, arg))

    def run(self, arrival_s: list[float] | None = None, on_arrival: Handler | None = None) -> None:
        """Runs until no event is left. Arrivals (sorted times, handler called with the index) are
        merged in without going through the heap; an arrival goes before other events at the same time."""
        heap, pop = self.heap, heapq.heappop
        arrivals = arrival_s or []
        num_arrivals, i, n = len(arrivals), 0, 0
        while True:
            if i < num_arrivals and (not heap or arrivals[i] <= heap[0][0]):
                self.now_s = time_s = arrivals[i]
                on_arrival(time_s, i)  # type: ignore[misc]
                i += 1
            elif heap:
                time_s, _, handler, arg = pop(heap)
                self.now_s = time_s
                handler(time_s, arg)
            else:
                break
            n += 1
        self.num_events += n
