"""The gateway's long-lived parts: role clients, the routing core fed by instance probes, admission,
metrics. The HTTP layer (app.py) calls it; tests can build one against any fleet."""

from __future__ import annotations

import asyncio
import logging
import time

from trtpd.gateway.config import GatewayConfig
from trtpd.gateway.loads import probe
from trtpd.gateway.metrics import PHASES, GatewayMetrics
from trtpd.gateway.orchestrator import FleetOrchestrator
from trtpd.gateway.role_client import RoleClient
from trtpd.gateway.timing import RequestTiming
from trtpd.routing.core import InstanceView, Router, RoutingPolicy

log = logging.getLogger(__name__)


class Ticket:
    """A request's place in the gateway: queued, then in flight; released exactly once."""

    def __init__(self, service: "FleetService") -> None:
        self.service = service
        self.state = "queued"

    async def enter(self) -> None:
        await self.service._slots.acquire()
        self.service.num_queued -= 1
        self.state = "inflight"
        self.service.metrics.queued.set(self.service.num_queued)
        self.service.metrics.inflight.inc()

    def release(self) -> None:
        svc = self.service
        if self.state == "queued":
            svc.num_queued -= 1
            svc.metrics.queued.set(svc.num_queued)
        elif self.state == "inflight":
            svc._slots.release()
            svc.metrics.inflight.dec()
        self.state = "released"

    def __del__(self) -> None:   # a streaming response that was never iterated (the client left at once)
        if self.state != "released":
            self.release()


class FleetService:
    def __init__(self, config: GatewayConfig, policy: RoutingPolicy | None = None) -> None:
        from trtpd.kv.handle import load_or_create_key_file
        from trtpd.engine.text_tokenizers import load_text_tokenizer

        self.config = config
        self.metrics = GatewayMetrics()
        self.tokenizer = load_text_tokenizer(config.tokenizer_dir)
        self.key = load_or_create_key_file(config.key_file)
        self.router = Router(policy or RoutingPolicy(tie_break="least_recent"))
        self.clients: dict[str, RoleClient] = {}
        self.orchestrator: FleetOrchestrator | None = None
        self.num_queued = 0
        self._slots: asyncio.Semaphore | None = None
        self._poller: asyncio.Task | None = None
        self.views: list[InstanceView] = []

    async def start(self) -> None:
        cfg = self.config
        self._slots = asyncio.Semaphore(cfg.max_inflight)
        self.clients = {i.name: RoleClient(i.name, i.grpc_url, i.model, self.key) for i in cfg.instances}
        self.orchestrator = FleetOrchestrator(cfg.mode, self.router, self.clients)
        await self.poll_once()
        self._poller = asyncio.create_task(self._poll_forever())

    async def stop(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
        for client in self.clients.values():
            await client.close()

    # ---- instance loads ----------------------------------------------------------------------
    async def poll_once(self) -> None:
        views = await asyncio.gather(*(asyncio.to_thread(probe, i.name, i.role, i.metrics_url)
                                       for i in self.config.instances))
        self.views = list(views)
        self.router.update(self.views, time.monotonic())
        m = self.metrics
        for v in self.views:
            m.up.labels(v.name, v.role).set(1 if v.state == "ready" else 0)
            m.waiting.labels(v.name, v.role).set(v.waiting)
            m.active.labels(v.name, v.role).set(v.active)
            m.kv_blocks.labels(v.name, v.role, "free").set(v.free_kv_blocks)
            m.kv_blocks.labels(v.name, v.role, "used").set(v.max_kv_blocks - v.free_kv_blocks)

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.poll_interval_s)
            try:
                await self.poll_once()
            except Exception:   # a probe bug must not stop routing updates for good
                log.exception("probing the instances failed")

    @property
    def admin_token(self) -> str:
        """What the fleet's controller sends (Bearer) to /admin: derived from the deployment key, so only
        the deployment's owner (the key file is 0600) can drain or restore an instance."""
        from trtpd.kv.auth import derive_key
        return derive_key(self.key, "gateway-admin").hex()

    def set_instance_state(self, name: str, state: str) -> dict:
        """Drains an instance (it gets no new request at once; what it serves finishes) or makes it ready."""
        from trtpd.gateway.app import ApiError

        if name not in {i.name for i in self.config.instances}:
            raise ApiError(f"no instance {name!r} in this fleet", "not_found", "name")
        if state not in ("draining", "ready"):
            raise ApiError(f"state must be draining or ready, got {state!r}", "invalid_arg", "state")
        self.router.set_state(name, state)
        return next(v for v in self.health()["instances"] if v["name"] == name)

    def health(self) -> dict:
        """seed 000 §4.5's health answer: status, and per instance its role, state and utilisation."""
        states = {v.name: v.state for v in self.router.instances()}   # with the router's overrides (draining)
        instances = [{"name": v.name, "role": v.role, "state": states.get(v.name, v.state), "waiting": v.waiting,
                      "active": v.active,
                      "kv_utilisation": round(1 - v.free_kv_blocks / v.max_kv_blocks, 4) if v.max_kv_blocks else None,
                      "batch_utilisation": round(v.active / v.max_batch_size, 4) if v.max_batch_size else None}
                     for v in self.views]
        needed = ("colocated",) if self.config.mode == "colocated" else ("prefill", "decode")
        ready = {i["role"] for i in instances if i["state"] == "ready"}
        all_ready = all(i["state"] in ("ready", "draining") for i in instances)   # draining is planned, not a fault
        status = "ok" if all_ready else "degraded" if all(r in ready for r in needed) else "unavailable"
        return {"status": status, "mode": self.config.mode, "model": self.config.model_name,
                "inflight": self.config.max_inflight - self._slots._value if self._slots else 0,
                "queued": self.num_queued, "instances": instances}

    # ---- admission ---------------------------------------------------------------------------
    def ticket(self) -> Ticket:
        """A place in the queue, or ApiError(429) when it is full."""
        from trtpd.gateway.app import ApiError

        busy = self._slots is not None and self._slots.locked()
        if busy and self.num_queued >= self.config.max_queued:
            raise ApiError(f"overloaded: {self.config.max_inflight} requests in flight and {self.num_queued} "
                           f"queued (limit {self.config.max_queued}); retry later", "overloaded")
        self.num_queued += 1
        self.metrics.queued.set(self.num_queued)
        return Ticket(self)

    # ---- per-request metrics -----------------------------------------------------------------
    def record(self, timing: RequestTiming, perf: dict[str, float]) -> None:
        m, now = self.metrics, time.monotonic()
        if timing.ttft_s is not None:
            m.ttft.observe(timing.ttft_s)
        for gap in timing.gaps_s:
            m.itl.observe(gap)
        if timing.tpot_s is not None:
            m.tpot.observe(timing.tpot_s)
        m.worst_stall.observe(timing.worst_stall_s)
        m.e2e.observe(now - timing.arrival_s)
        for name, phase in PHASES.items():
            if name in perf:
                m.breakdown.labels(phase).observe(perf[name] / 1000.0)
        if "kv_transfer_bytes" in perf:
            m.kv_bytes.inc(perf["kv_transfer_bytes"])
        if "kv_transfer_ms" in perf:
            m.kv_seconds.observe(perf["kv_transfer_ms"] / 1000.0)
        m.finished.inc()
        if timing.meets(self.config.slo_ttft_s, self.config.slo_tpot_s):
            m.slo_met.inc()
