"""Logging that cannot flood: the same message (logger, level, template) is written at most `burst` times
per `window_s`; the rest are counted and summed up in one line when the window turns. A server that hits
the same fault thousands of times a second (a full file table, a broken peer) keeps a readable log of a
bounded size."""

from __future__ import annotations

import logging
import time


class RepeatFilter(logging.Filter):
    def __init__(self, burst: int = 20, window_s: float = 60.0, clock=time.monotonic) -> None:
        super().__init__()
        self.burst = burst
        self.window_s = window_s
        self.clock = clock
        self.window_start = clock()
        self.counts: dict[tuple, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        now = self.clock()
        if now - self.window_start >= self.window_s:
            counts, self.window_start, self.counts = self.counts, now, {}
            self._summarize(counts)
        key = (record.name, record.levelno, str(record.msg))
        count = self.counts[key] = self.counts.get(key, 0) + 1
        return count <= self.burst

    def _summarize(self, counts: dict[tuple, int]) -> None:
        suppressed = {k: n - self.burst for k, n in counts.items() if n > self.burst}
        if suppressed:
            lines = "; ".join(f"{n} x {name}: {msg[:120]!r}" for (name, _, msg), n in
                              sorted(suppressed.items(), key=lambda kv: -kv[1])[:10])
            # written straight to the handlers' streams would bypass formatting; a plain warning record instead
            logging.getLogger("trtpd.log_limits").handle(logging.LogRecord(
                "trtpd.log_limits", logging.WARNING, __file__, 0,
                f"suppressed repeated log messages in the last {self.window_s:.0f} s: {lines}", None, None))


def configure(level: int = logging.INFO, burst: int = 20, window_s: float = 60.0) -> RepeatFilter:
    """basicConfig with a RepeatFilter on the root handler (for server processes: gateway, controller)."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    limiter = RepeatFilter(burst, window_s)
    for handler in logging.getLogger().handlers:
        handler.addFilter(limiter)
    return limiter
