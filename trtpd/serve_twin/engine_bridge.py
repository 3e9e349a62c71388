"""The reference engine under an asyncio server: requests in from the event loop, outputs back to it.

The engine runs on its loop's thread (trtpd/engine/loop.py), as in the Triton role model; each request's outputs
reach the coroutine that serves it through an asyncio queue. A request whose consumer stops before its final
output (the client went away) is aborted in the engine, which frees its KV at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from trtpd.engine.loader import LoadedEngine
from trtpd.engine.loop import EngineLoop
from trtpd.engine.request import EngineOutput, EngineRequest


class AsyncEngine:
    def __init__(self, loaded: LoadedEngine, name: str = "engine",
                 on_output: Callable[[], None] | None = None, step_delay_s: float = 0.0) -> None:
        """on_output: called on the engine thread before each output is handed over (iteration stats).
        step_delay_s: fault injection, a pause after every step that produced output (EngineLoop's)."""
        self.loaded = loaded
        self.on_output = on_output
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queues: dict[str, asyncio.Queue[EngineOutput]] = {}
        self.engine_loop = EngineLoop(loaded.engine, self._on_output, name=name, step_delay_s=step_delay_s)

    def _on_output(self, out: EngineOutput) -> None:       # the engine thread
        if self.on_output is not None:
            self.on_output()
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._deliver, out)

    def _deliver(self, out: EngineOutput) -> None:          # the event loop
        queue = self._queues.get(out.request_id)
        if queue is not None:
            queue.put_nowait(out)

    def validate(self, request: EngineRequest) -> None:
        """Raises RequestError (the client's fault, named) or a KV error, before anything is queued."""
        self.loaded.engine.validate(request)

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        """The request's outputs until its final one (validate it first). Closing the iterator before then
        aborts the request in the engine."""
        self._loop = asyncio.get_running_loop()
        queue: asyncio.Queue[EngineOutput] = asyncio.Queue()
        self._queues[request.request_id] = queue
        finished = False
        try:
            self.engine_loop.submit(request)
            while not finished:
                out = await queue.get()
                finished = out.finished
                yield out
        finally:
            self._queues.pop(request.request_id, None)
            if not finished:
                self.engine_loop.abort(request.request_id)

    def stats(self) -> dict[str, float]:
        return self.loaded.engine.stats()

    def close(self) -> None:
        self.engine_loop.stop(timeout_s=2.0)
        self.loaded.close()
