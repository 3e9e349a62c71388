"""The in-server orchestrator's way into a fleet: inside the `disagg_bls` stub of a fleet's Triton entry
server, an asyncio loop on its own thread runs the gateway's FleetService (role clients over gRPC, the
routing core fed by instance probes, retries), so Triton clients of the `ensemble` are routed across the
fleet's instances exactly as OpenAI clients of the gateway are. `generate` is the blocking face the BLS's
per-request threads use."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path


class FleetBridge:
    def __init__(self, fleet_file: str, start_timeout_s: float = 60.0) -> None:
        from trtpd.gateway.config import from_fleet_file
        from trtpd.gateway.service import FleetService

        self.service = FleetService(from_fleet_file(Path(fleet_file)))
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="fleet-bridge", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.service.start(), self.loop).result(start_timeout_s)

    def generate(self, request_id: str, prompt_ids: list[int], sampling) -> Iterator:
        """The orchestrator's Generated steps, one by one; closing the iterator cancels the request."""
        steps = self.service.orchestrator.generate(request_id, prompt_ids, sampling)
        try:
            while True:
                try:
                    yield asyncio.run_coroutine_threadsafe(steps.__anext__(), self.loop).result()
                except StopAsyncIteration:
                    return
        finally:
            asyncio.run_coroutine_threadsafe(steps.aclose(), self.loop).result(30)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.service.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
