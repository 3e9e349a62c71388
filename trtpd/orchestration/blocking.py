"""The orchestrator's blocking face, for callers on plain threads.

The single server's BLS (trtpd/serving/bls_model.py) serves each client request on a thread of Triton's python
stub, and its transport's sub-requests are blocking BLS calls. It runs the one orchestrator (orchestrator.py)
through this face: each request's steps are taken on an event loop of that request's own (`BlockingSteps`), so
the blocking calls inside the transport hold up no other request, and the routing core the requests share is
called under one lock (`LockedRouter`; the Router itself is single-threaded: the gateway calls it from its one
event loop).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Iterable
from typing import Generic, TypeVar

from trtpd.routing.core import FailureDecision, InstanceView, Route, Router

T = TypeVar("T")


class BlockingSteps(Generic[T]):
    """Iterates an async generator from a plain thread, on an event loop of its own. `close()` (also called when
    the generator ends or raises) closes the generator, so its `finally` blocks run (an unfinished
    sub-request is cancelled on its instance), then finalizes the async generators it was iterating and the loop."""

    def __init__(self, steps: AsyncGenerator[T, None]) -> None:
        self._steps = steps
        self._loop = asyncio.new_event_loop()

    def __iter__(self) -> "BlockingSteps[T]":
        return self

    def __next__(self) -> T:
        try:
            return self._loop.run_until_complete(self._steps.__anext__())
        except StopAsyncIteration:
            self.close()
            raise StopIteration from None
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._loop.run_until_complete(self._steps.aclose())
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        finally:
            self._loop.close()


class LockedRouter:
    """A Router shared by threads: the calls the orchestrator makes, each under one lock."""

    def __init__(self, router: Router) -> None:
        self._router = router
        self._lock = threading.Lock()

    @property
    def policy(self):
        return self._router.policy

    def update(self, views: Iterable[InstanceView], now_s: float) -> None:
        with self._lock:
            self._router.update(views, now_s)

    def pick_prefill(self, request_id: str, num_prompt_tokens: int, now_s: float,
                     exclude: frozenset[str] = frozenset()) -> Route | None:
        with self._lock:
            return self._router.pick_prefill(request_id, num_prompt_tokens, now_s, exclude)

    def pick_decode(self, request_id: str, num_prompt_tokens: int, max_new_tokens: int, now_s: float,
                    exclude: frozenset[str] = frozenset()) -> Route | None:
        with self._lock:
            return self._router.pick_decode(request_id, num_prompt_tokens, max_new_tokens, now_s, exclude)

    def pick_colocated(self, request_id: str, num_prompt_tokens: int, max_new_tokens: int, now_s: float,
                       exclude: frozenset[str] = frozenset()) -> Route | None:
        with self._lock:
            return self._router.pick_colocated(request_id, num_prompt_tokens, max_new_tokens, now_s, exclude)

    def prefill_done(self, request_id: str) -> None:
        with self._lock:
            self._router.prefill_done(request_id)

    def decode_started(self, request_id: str) -> None:
        with self._lock:
            self._router.decode_started(request_id)

    def release(self, request_id: str) -> None:
        with self._lock:
            self._router.release(request_id)

    def on_failure(self, request_id: str, stage: str, error_kind: str, attempt: int, failed_instance: str,
                   now_s: float) -> FailureDecision:
        with self._lock:
            return self._router.on_failure(request_id, stage, error_kind, attempt, failed_instance, now_s)

    @property
    def num_tracked_requests(self) -> int:
        with self._lock:
            return self._router.num_tracked_requests
