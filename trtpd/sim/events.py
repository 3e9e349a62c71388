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

    def run(self) -> None:
        heap, pop = self.heap, heapq.heappop
        n = 0
        while heap:
            time_s, _, handler, arg = pop(heap)
            self.now_s = time_s
            handler(time_s, arg)
            n += 1
        self.num_events += n
