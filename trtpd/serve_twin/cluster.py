"""A worker's registration with a disagg cluster over HTTP, as trtllm-serve 1.2.1 does it
(tensorrt_llm/serve/disagg_auto_scaling.py DisaggClusterWorker, cluster_storage.py HttpClusterStorageClient):

    register   POST   {uri}/set     {"key", "value": WorkerInfo JSON, "expire_time": -1, "ttl": inactive_timeout,
                                     "overwrite_if_exists": false}; retried every 5 s until it is taken
    heartbeat  GET    {uri}/expire?key=...&ttl=inactive_timeout every heartbeat_interval_sec (when it is shorter
                                     than inactive_timeout_sec); anything but 200 registers again
    leave      DELETE {uri}/delete?key=...
The key is /trtllm-disagg/<cluster_name>/workers/<ROLE>-<host>:<port>-<ms>-<pid>-<rnd>.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time

import httpx

from trtpd.schema.trtllm_serve import SERVER_ROLES, WorkerInfo, workers_prefix
from trtpd.serve_twin.options import DisaggClusterOptions

log = logging.getLogger(__name__)
RETRY_INTERVAL_S = 5.0
CLIENT_TIMEOUT_S = 5.0


def _base(uri: str) -> str:
    return (uri if uri.startswith(("http://", "https://")) else f"http://{uri}").rstrip("/")


class ClusterWorker:
    def __init__(self, cluster: DisaggClusterOptions, role: str, host: str, port: int, token: str | None = None) -> None:
        """token: sent as `Authorization: Bearer` (trtpd's gateway admits only members that hold the deployment
        key; upstream's 1.2.1 storage server has no authentication and ignores it)."""
        self.cluster = cluster
        self.info = WorkerInfo(f"{role}-{host}:{port}-{int(time.time() * 1000)}-{os.getpid()}-"
                               f"{random.randint(0, 1000):03}", host, port, SERVER_ROLES[role])
        self.key = f"{workers_prefix(cluster.cluster_name)}/{self.info.worker_id}"
        self.base = _base(cluster.cluster_uri)
        self.client = httpx.AsyncClient(timeout=CLIENT_TIMEOUT_S,
                                        headers={"Authorization": f"Bearer {token}"} if token else None)
        self._task: asyncio.Task | None = None

    async def _set(self) -> bool:
        try:
            r = await self.client.post(f"{self.base}/set", json={
                "key": self.key, "value": self.info.to_json(), "expire_time": -1,
                "ttl": int(self.cluster.inactive_timeout_sec), "overwrite_if_exists": False})
            return r.status_code == 200
        except httpx.HTTPError as exc:
            log.warning("registering %s with %s failed: %s", self.info.worker_id, self.base, exc)
            return False

    async def register(self) -> None:
        while not await self._set():
            log.warning("worker %s is not registered with %s; retrying in %.0f s", self.info.worker_id, self.base,
                        RETRY_INTERVAL_S)
            await asyncio.sleep(RETRY_INTERVAL_S)
        log.info("worker %s registered with %s", self.info.worker_id, self.base)

    async def start(self) -> None:
        """Registers in the background (the server serves meanwhile), then heartbeats."""
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        await self.register()
        interval = self.cluster.heartbeat_interval_sec
        if not 0 < interval < self.cluster.inactive_timeout_sec:
            return
        while True:
            await asyncio.sleep(interval)
            try:
                r = await self.client.get(f"{self.base}/expire",
                                          params={"key": self.key, "ttl": int(self.cluster.inactive_timeout_sec)})
                alive = r.status_code == 200
            except httpx.HTTPError:
                alive = False
            if not alive:
                await self.register()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        try:
            r = await self.client.delete(f"{self.base}/delete", params={"key": self.key})
            if r.status_code != 200:
                log.warning("deregistering %s: the cluster answered %d", self.info.worker_id, r.status_code)
        except httpx.HTTPError as exc:
            log.warning("deregistering %s failed: %s", self.info.worker_id, exc)
        await self.client.aclose()
