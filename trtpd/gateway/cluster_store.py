"""The gateway as a disagg cluster's storage: the key-value store with expiry that trtllm-serve workers register
in over HTTP (TensorRT-LLM 1.2.1's HttpClusterStorageServer, tensorrt_llm/serve/cluster_storage.py). Pure; the
clock is a parameter.

Upstream's semantics, kept: `set` with ttl > 0 expires the key ttl seconds later unless `expire` renews it (the
workers' heartbeat), a key that exists is not overwritten unless asked, and expired keys are dropped by a sweep
(upstream's runs every second) and on read. What the gateway adds is who may write (app.py: the deployment's
cluster token), and what it does with the members (service.py: routes to them once they answer, drains them when
they leave).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Entry:
    value: str
    expires_at_s: float      # monotonic; 0: never


class ClusterStore:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._entries: dict[str, _Entry] = {}
        self.version = 0     # bumped on every change a reader must see (set, delete, expiry)

    def _live(self, key: str) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is not None and 0 < entry.expires_at_s <= self.clock():
            del self._entries[key]
            self.version += 1
            return None
        return entry

    def set(self, key: str, value: str, ttl_s: float = -1, overwrite: bool = False) -> bool:
        if self._live(key) is not None and not overwrite:
            return False
        self._entries[key] = _Entry(value, self.clock() + ttl_s if ttl_s > 0 else 0.0)
        self.version += 1
        return True

    def get(self, key: str) -> str | None:
        entry = self._live(key)
        return None if entry is None else entry.value

    def delete(self, key: str) -> bool:
        if self._live(key) is None:
            return False
        del self._entries[key]
        self.version += 1
        return True

    def expire(self, key: str, ttl_s: float) -> bool:
        """Renews the key's expiry (a heartbeat); False when it is gone."""
        entry = self._live(key)
        if entry is None:
            return False
        entry.expires_at_s = self.clock() + ttl_s if ttl_s > 0 else 0.0
        return True

    def get_prefix(self, prefix: str, keys_only: bool = False) -> dict[str, str]:
        self.sweep()
        return {k: ("" if keys_only else e.value) for k, e in sorted(self._entries.items()) if k.startswith(prefix)}

    def sweep(self) -> list[str]:
        """Drops the expired keys; returns them."""
        now = self.clock()
        gone = [k for k, e in self._entries.items() if 0 < e.expires_at_s <= now]
        for key in gone:
            del self._entries[key]
        if gone:
            self.version += 1
        return gone
