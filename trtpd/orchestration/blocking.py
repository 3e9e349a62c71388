"""The orchestrator's blocking face, for callers on plain threads.

The single server's entry (trtpd/serving/bls_model.py) serves each client request on a thread of Triton's python
stub. The orchestrator, its routing core and its transport's connections live on one event loop, on a thread of
its own (`LoopThread`), as they live on the gateway's loop; a request thread takes its request's steps from there
one at a time (`BlockingSteps`). Only the loop's thread touches the routing core, so it needs no lock.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import AsyncGenerator, Coroutine
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class LoopThread:
    """An event loop running on a daemon thread of its own."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Runs `coro` on the loop; blocks the calling thread (never the loop's own) until it returns."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def steps(self, agen: AsyncGenerator[T, None]) -> "BlockingSteps[T]":
        return BlockingSteps(agen, self.loop)

    def stop(self, timeout_s: float = 5.0) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout_s)


class BlockingSteps(Generic[T]):
    """Iterates an async generator that runs on `loop` (another thread's) from a plain thread. `close()` (also
    called when the generator ends or raises) closes the generator, so its `finally` blocks run (an unfinished
    sub-request is cancelled on its instance). `cancel()`, from any thread, stops the step being awaited: the
    waiting thread gets concurrent.futures.CancelledError."""

    def __init__(self, agen: AsyncGenerator[T, None], loop: asyncio.AbstractEventLoop) -> None:
        self._agen = agen
        self._loop = loop
        self._pending: concurrent.futures.Future | None = None
        self._lock = threading.Lock()
        self._closed = self._cancelled = False

    def __iter__(self) -> "BlockingSteps[T]":
        return self

    def __next__(self) -> T:
        with self._lock:
            if self._cancelled:
                raise concurrent.futures.CancelledError()
            pending = self._pending = asyncio.run_coroutine_threadsafe(self._agen.__anext__(), self._loop)
        try:
            value = pending.result()
        except BaseException as exc:
            self._waited()
            self.close()
            if isinstance(exc, StopAsyncIteration):
                raise StopIteration from None
            raise
        self._waited()
        return value

    def _waited(self) -> None:
        with self._lock:
            self._pending = None

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            if self._pending is not None:
                self._pending.cancel()    # the task on the loop is cancelled: the generator's finally blocks run

    def close(self) -> None:
        """Closes the generator (waits for its finally blocks on the loop); a second call does nothing."""
        with self._lock:
            if self._closed or self._pending is not None:
                return   # a step is still awaited on another thread (cancel() ends it; its thread closes)
            self._closed = True
        try:
            asyncio.run_coroutine_threadsafe(self._agen.aclose(), self._loop).result()
        except (RuntimeError, concurrent.futures.CancelledError):
            pass   # a generator cancelled mid-step is closed already
