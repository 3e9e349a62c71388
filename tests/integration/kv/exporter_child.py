"""A prefill-side process for the KV integration tests: hosts KvExporters, driven by JSON lines on stdin.

Each command is one JSON object per line; each answer one JSON object per line on stdout ({"error": ...}
when the command raised). Pools live in /dev/shm under the names the test gives, filled from a seed so
the test can compute the expected bytes; the child removes them when it stops.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import torch

from trtpd.kv.exporter import KvExporter
from trtpd.kv.layout import KvLayout
from trtpd.kv.pool import KvPool
from trtpd.kv.spans import pool_bytes


class Child:
    def __init__(self) -> None:
        self.exporters: dict[str, KvExporter] = {}
        self.pools: dict[str, KvPool] = {}
        self.released: dict[str, set[str]] = {}
        self.wakeups: dict[str, threading.Event] = {}

    def start(self, name: str, layout: dict, num_blocks: int, shm_name: str, seed: int, key_hex: str,
              transport: str, timeout_s: float) -> dict:
        pool = KvPool(KvLayout.from_dict(layout), num_blocks, shm_name=shm_name)
        self.pools[name] = pool
        generator = torch.Generator().manual_seed(seed)
        pool_bytes(pool)[:] = torch.randint(0, 256, (pool.nbytes,), generator=generator, dtype=torch.uint8).numpy()
        self.wakeups[name] = threading.Event()
        self.released[name] = set()
        exporter = KvExporter(pool, bytes.fromhex(key_hex), transport=transport, transfer_timeout_s=timeout_s)
        exporter.wakeup = self.wakeups[name].set       # as the engine loop attaches it, after construction
        self.exporters[name] = exporter
        return {"endpoint": exporter.endpoint}

    def register(self, name: str, request_id: str, block_ids: list[int], num_tokens: int) -> dict:
        return {"handle": self.exporters[name].register(request_id, block_ids, num_tokens).hex()}

    def mark(self, name: str, request_ids: list[str], layer: int) -> dict:
        self.exporters[name].mark_layers_ready(request_ids, layer)
        return {}

    def complete(self, name: str, request_id: str, first_token: int) -> dict:
        return {"handle": self.exporters[name].complete(request_id, first_token).hex()}

    def fail(self, name: str, request_id: str, reason: str) -> dict:
        self.exporters[name].fail(request_id, reason)
        return {}

    def wait_released(self, name: str, request_id: str, timeout_s: float) -> dict:
        """Waits on the exporter's wakeup callback until `request_id` is released, or the deadline."""
        deadline_s = time.monotonic() + timeout_s
        wakeup, released = self.wakeups[name], self.released[name]
        while True:
            wakeup.clear()
            released.update(self.exporters[name].drain_released())
            remaining_s = deadline_s - time.monotonic()
            if request_id in released or remaining_s <= 0:
                return {"released": request_id in released}
            wakeup.wait(remaining_s)

    def stats(self, name: str) -> dict:
        exporter = self.exporters[name]
        answer = {"num_pending": exporter.num_pending, **vars(exporter.counters)}
        if exporter.transport == "mpi":     # this process's MPI connection handshakes (all its exporters)
            from trtpd.kv.mpi_mover import MpiWorld
            answer["mpi_handshakes"] = MpiWorld.get().num_handshakes
        return answer

    def close(self, name: str) -> dict:
        self.exporters.pop(name).close()
        self.pools.pop(name).close()
        return {}

    def stop(self) -> None:
        for name in list(self.exporters):
            self.close(name)


def main() -> None:
    torch.set_num_threads(1)
    child = Child()
    try:
        for line in sys.stdin:
            command = json.loads(line)
            name = command.pop("cmd")
            if name == "stop":
                break
            try:
                answer = getattr(child, name)(**command)
            except Exception as e:  # noqa: BLE001 - reported to the test, which fails on it
                answer = {"error": f"{type(e).__name__}: {e}"}
            print(json.dumps(answer), flush=True)
    finally:
        child.stop()


if __name__ == "__main__":
    main()
