"""The fleet's request service: role clients, the routing core fed by instance probes, admission, the canary
cohort, metrics and the controller's request samples. Every request to a fleet goes through `ServedRequest`,
whichever face it came in by: the gateway's OpenAI HTTP (app.py) or the fleet's Triton entry (the
`disagg_bls` stub, trtpd/serving/fleet_bridge.py), so the rollout gate and the autoscaler see both alike.
Tests can build one against any fleet."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from dataclasses import replace

from collections.abc import AsyncIterator

from trtpd.admission import Admission, Ticket
from trtpd.gateway.config import GatewayConfig, InstanceTarget
from trtpd.gateway.loads import probe
from trtpd.gateway.metrics import PHASES, GatewayMetrics
from trtpd.transports.triton_grpc import RoleClient
from trtpd.orchestration.orchestrator import Generated, Orchestrator, OrchestratorError
from trtpd.orchestration.transport import RoleTransport, SamplingInputs
from trtpd.gateway.timing import RequestTiming
from trtpd.percentiles import quantile
from trtpd.routing.cohorts import Cohort, Split
from trtpd.schema.request_sample import RequestSample
from trtpd.routing.core import InstanceView, Router, RoutingPolicy

MAX_SAMPLES = 20000     # recent finished requests kept for the controller's rollout gate (GET /admin/requests)
PERF_WAIT_S = 2.0       # how long a finished request's metrics wait for timings its instances report afterwards

log = logging.getLogger(__name__)


class FleetService:
    def __init__(self, config: GatewayConfig, policy: RoutingPolicy | None = None) -> None:
        from trtpd.kv.handle import load_or_create_key_file
        from trtpd.engine.text_tokenizers import load_text_tokenizer

        self.config = config
        self.metrics = GatewayMetrics()
        self.tokenizer = load_text_tokenizer(config.tokenizer_dir)
        self.key = load_or_create_key_file(config.key_file)
        self.router = Router(policy or RoutingPolicy(tie_break="least_recent"))
        self.clients: dict[str, RoleTransport] = {}
        self.orchestrator: Orchestrator | None = None
        self.admission = Admission(config.max_inflight, config.max_queued, on_change=self._admission_changed)
        self._poller: asyncio.Task | None = None
        self.views: list[InstanceView] = []
        self.draining: set[str] = set()          # the router keeps these draining (fleet.json or PUT /admin)
        self.split = Split()                     # the canary traffic split (fleet.json "traffic")
        self.samples: deque[RequestSample] = deque(maxlen=MAX_SAMPLES)
        self.num_routed = 0
        self._fleet_stamp: tuple[int, int] | None = None
        self._closing: list[tuple[RoleTransport, float]] = []   # removed instances' clients, since when
        self._finishing: set[asyncio.Task] = set()   # finished requests waiting for their instances' timings
        from trtpd.gateway.cluster_store import ClusterStore
        self.cluster = ClusterStore()                 # trtllm-serve workers registered with this gateway
        self._static: tuple[InstanceTarget, ...] = config.instances   # fleet.json's

    async def start(self) -> None:
        cfg = self.config
        self._set_instances(cfg.instances)
        self.orchestrator = Orchestrator(cfg.mode, self.router, self.clients,
                                         wait_for_instance_s=cfg.wait_for_instance_s, give_up=self.give_up_kv,
                                         alive=self.instance_alive)
        self.reload()
        await self.poll_once()
        self._poller = asyncio.create_task(self._poll_forever())

    def _client(self, inst: InstanceTarget) -> RoleTransport:
        """The instance's RoleTransport, by the protocol it speaks (fleet.json `protocol`)."""
        if inst.protocol == "trtllm-serve":
            from trtpd.transports.trtllm_http import ServeClient
            return ServeClient(inst.name, inst.http_url, inst.model, self.key)
        return RoleClient(inst.name, inst.grpc_url, inst.model, self.key)

    def give_up_kv(self, instance: str, request_id: str, handle: bytes | None) -> None:
        """The orchestrator's give_up: on a worker thread, tells the prefill exporter that no decode will pull this
        export (by its handle, or by the sub-request's id when the handle never arrived), so it frees the blocks
        now (best effort: the export's deadline frees them otherwise)."""
        endpoint = next((i.kv_endpoint for i in self.config.instances if i.name == instance), "")
        client = self.clients.get(instance)
        if handle is not None and client is not None:
            handle = client.kv_handle(handle)
            if handle is None:    # e.g. a real trtllm-serve worker: it frees the export at its kv_transfer_timeout_ms
                return
        from trtpd.kv.importer import give_up_best_effort
        asyncio.get_running_loop().run_in_executor(None, give_up_best_effort, self.key, handle, endpoint, request_id)

    async def stop(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
        for task in list(self._finishing):
            task.cancel()
        for client in [*self.clients.values(), *(c for c, _ in self._closing)]:
            await client.close()

    # ---- the fleet file: instances come and go under the controller --------------------------
    def reload(self, force: bool = False) -> bool:
        """Re-reads fleet.json if it changed (or `force`): new instances get a client, removed ones lose
        theirs (closed a poll later, after what they served has ended), drains, the canary split and the
        routing policy are applied. Returns whether anything was read."""
        from trtpd.gateway.config import fleet_directives, from_fleet_file

        path = self.config.fleet_file
        if path is None:
            return False
        try:
            st = os.stat(path)
        except OSError:
            return False
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._fleet_stamp and not force:
            return False
        fresh = from_fleet_file(path)
        directives = fleet_directives(path)
        self._fleet_stamp = stamp
        self.config = replace(self.config, max_input_len=fresh.max_input_len, max_seq_len=fresh.max_seq_len)
        self._set_instances(fresh.instances)
        names = {i.name for i in fresh.instances}
        self.draining = {n for n in directives.draining if n in names}
        self.split = Split.from_dict(directives.traffic)
        if directives.routing is not None:
            policy = RoutingPolicy(**{k: tuple((m, tuple(n)) for m, n in v) if k == "prefill_buckets" else v
                                      for k, v in directives.routing.items()})
            if policy != self.router.policy:
                self.router.set_policy(policy)
        self._apply_draining()
        return True

    def _set_instances(self, static: tuple[InstanceTarget, ...]) -> None:
        """The instances routed to: fleet.json's and the cluster's registered members. New ones get a client,
        removed ones lose theirs (closed a poll later, after what they served has ended)."""
        self._static = tuple(static)
        names = {i.name for i in self._static}
        instances = self._static + tuple(m for m in self._members() if m.name not in names)
        self.config = replace(self.config, instances=instances)
        names = {i.name for i in instances}
        for inst in instances:
            if inst.name not in self.clients:
                self.clients[inst.name] = self._client(inst)
        for name in [n for n in self.clients if n not in names]:
            self._closing.append((self.clients.pop(name), time.monotonic()))

    # ---- the disagg cluster: trtllm-serve workers that register themselves (cluster_store.py) ----------------
    def _members(self) -> list[InstanceTarget]:
        """Each registered worker as an instance: CONTEXT ones prefill, GENERATION ones decode, named
        <role>@<host>:<port> (a worker that registers again under a new id is the same instance)."""
        from trtpd.schema.trtllm_serve import ProtocolError, WorkerInfo, workers_prefix

        members = {}
        for key, value in self.cluster.get_prefix(workers_prefix(self.config.cluster_name) + "/").items():
            try:
                info = WorkerInfo.from_json(value)
            except ProtocolError as exc:
                log.warning("cluster member %s: %s; not routed to", key, exc)
                continue
            role = "prefill" if info.role == 0 else "decode"
            name = f"{role}@{info.host}:{info.port}"
            members[name] = InstanceTarget(name, role, self.config.model_name, "", "", protocol="trtllm-serve",
                                           http_url=f"{info.host}:{info.port}")
        return list(members.values())

    def cluster_changed(self) -> None:
        """A member registered, left or expired: route to the new ones once their probe answers, drain the gone."""
        self._set_instances(self._static)
        self._apply_draining()

    @property
    def cluster_token(self) -> str:
        from trtpd.kv.auth import cluster_token
        return cluster_token(self.key)

    def cluster_info(self) -> dict:
        """Upstream's router's /cluster_info shape: is_ready, current_workers by section, minimal_instances."""
        members = self._members()
        sections = {"context_servers": [m for m in members if m.role == "prefill"],
                    "generation_servers": [m for m in members if m.role == "decode"]}
        ready = {v.name for v in self.router.instances() if v.state == "ready"}
        needed = ("prefill", "decode") if self.config.mode == "disaggregated" else ("colocated",)
        return {"is_ready": all(any(i.role == r and i.name in ready for i in self.config.instances) for r in needed),
                "current_workers": {k: [{"name": m.name, "url": f"http://{m.http_url}"} for m in v]
                                    for k, v in sections.items()},
                "minimal_instances": {"context_servers": 1, "generation_servers": 1}}

    def _apply_draining(self) -> None:
        """The router's draining marks follow the fleet file's; an instance the file no longer has (its client
        is gone) is marked draining too, until the next probe drops it from the router's snapshot."""
        states = {v.name: v.state for v in self.router.instances()}
        in_fleet = {i.name for i in self.config.instances}
        for name, state in states.items():
            unroutable = name in self.draining or name not in in_fleet
            if unroutable and state != "draining":
                self.router.set_state(name, "draining")
            elif not unroutable and state == "draining":
                self.router.set_state(name, "ready")

    def cohort(self) -> Cohort:
        """The cohort the next request is served by: its revision by the split's share, and the instances it
        must not use (see regroup)."""
        sequence, self.num_routed = self.num_routed, self.num_routed + 1
        revision, exclude = self.regroup(self.split.revision_for(sequence))
        return Cohort(revision, exclude, self.regroup)

    def regroup(self, revision: int) -> tuple[int, frozenset[str]]:
        """A request of `revision` under the split as it is now: the revision it is served by and the instances
        it must not use. A cohort with no ready instance left in a changed role (a canary that died, the last
        stable instance draining during promotion, the canary draining in a rollback) hands its requests to the
        other cohort rather than fail them."""
        split = self.split
        instances = [(i.name, i.role) for i in self.config.instances]
        exclude = split.excluded(revision, instances)
        if split.active:
            ready = {v.name: v.role for v in self.router.instances() if v.state == "ready"}
            if not all(any(r == role and n not in exclude for n, r in ready.items()) for role in split.changed_roles):
                other = split.stable_revision if revision == split.canary_revision else split.canary_revision
                revision, exclude = other, split.excluded(other, instances)
        return revision, exclude

    # ---- instance loads ----------------------------------------------------------------------
    async def poll_once(self) -> None:
        views = await asyncio.gather(*(self._probe(i) for i in self.config.instances))
        self.views = list(views)
        self.router.update(self.views, time.monotonic())
        self._apply_draining()
        m = self.metrics
        for v in self.views:
            m.up.labels(v.name, v.role).set(1 if v.state == "ready" else 0)
            m.waiting.labels(v.name, v.role).set(v.waiting)
            m.active.labels(v.name, v.role).set(v.active)
            m.kv_blocks.labels(v.name, v.role, "free").set(v.free_kv_blocks)
            m.kv_blocks.labels(v.name, v.role, "used").set(v.max_kv_blocks - v.free_kv_blocks)

    async def instance_alive(self, name: str) -> bool:
        """Whether the instance answers its probe now (the orchestrator asks after a generation request failed with
        words that do not say whether its KV pull or decode failed)."""
        inst = next((i for i in self.config.instances if i.name == name), None)
        return inst is not None and (await self._probe(inst)).state != "unhealthy"

    async def _probe(self, inst: InstanceTarget) -> InstanceView:
        client = self.clients.get(inst.name)
        if inst.protocol == "trtllm-serve" and client is not None:
            return await client.probe(inst.role)     # its /metrics iteration stats (ServeClient.probe)
        return await asyncio.to_thread(probe, inst.name, inst.role, inst.metrics_url, model=inst.model if inst.world
                                       else None, kv_domain=inst.world)

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.poll_interval_s)
            # a removed instance's client closes once nothing of this gateway runs on it (or after 10 min)
            holds = self.orchestrator.holds if self.orchestrator else {}
            now = time.monotonic()
            closing = [(c, t) for c, t in self._closing if holds.get(c.name, 0) == 0 or now - t > 600]
            self._closing = [(c, t) for c, t in self._closing if (c, t) not in closing]
            for client, _ in closing:
                await client.close()
            try:
                if self.cluster.sweep():      # members whose heartbeat stopped: drained
                    self.cluster_changed()
                self.reload()
                await self.poll_once()
            except Exception:   # a probe bug must not stop routing updates for good
                log.exception("probing the instances failed")

    @property
    def admin_token(self) -> str:
        """What the fleet's controller sends (Bearer) to /admin (trtpd.kv.auth.gateway_admin_token)."""
        from trtpd.kv.auth import gateway_admin_token
        return gateway_admin_token(self.key)

    def set_instance_state(self, name: str, state: str) -> dict:
        """Drains an instance (it gets no new request at once; what it serves finishes) or makes it ready."""
        from trtpd.gateway.app import ApiError

        if name not in {i.name for i in self.config.instances}:
            raise ApiError(f"no instance {name!r} in this fleet", "not_found", "name")
        if state not in ("draining", "ready"):
            raise ApiError(f"state must be draining or ready, got {state!r}", "invalid_arg", "state")
        if state == "draining":
            self.draining.add(name)
        else:
            self.draining.discard(name)
        self.router.set_state(name, state)
        return next(v for v in self.health()["instances"] if v["name"] == name)

    def health(self) -> dict:
        """seed 000 §4.5's health answer: status, and per instance its role, state and utilisation."""
        states = {v.name: v.state for v in self.router.instances()}   # with the router's overrides (draining)
        revisions = {i.name: i.revision for i in self.config.instances}
        instances = [{"name": v.name, "role": v.role, "state": states.get(v.name, v.state), "waiting": v.waiting,
                      "active": v.active, "revision": revisions.get(v.name, 0),
                      "gateway_holds": self.orchestrator.holds.get(v.name, 0) if self.orchestrator else 0,
                      "kv_utilisation": round(1 - v.free_kv_blocks / v.max_kv_blocks, 4) if v.max_kv_blocks else None,
                      "batch_utilisation": round(v.active / v.max_batch_size, 4) if v.max_batch_size else None}
                     for v in self.views]
        needed = ("colocated",) if self.config.mode == "colocated" else ("prefill", "decode")
        ready = {i["role"] for i in instances if i["state"] == "ready"}
        all_ready = all(i["state"] in ("ready", "draining") for i in instances)   # draining is planned, not a fault
        status = "ok" if all_ready else "degraded" if all(r in ready for r in needed) else "unavailable"
        return {"status": status, "mode": self.config.mode, "model": self.config.model_name,
                "inflight": self.admission.num_inflight, "queued": self.admission.num_queued,
                "peak_inflight": self.admission.peak_inflight, "peak_queued": self.admission.peak_queued,
                "refused": self.admission.num_refused, "instances": instances}

    # ---- admission ---------------------------------------------------------------------------
    def _admission_changed(self, admission: Admission) -> None:
        self.metrics.inflight.set(admission.num_inflight)
        self.metrics.queued.set(admission.num_queued)

    # ---- per-request metrics -----------------------------------------------------------------
    def sample(self, timing: RequestTiming, revision: int, error_kind: str | None, instances: tuple[str, str],
               num_prompt_tokens: int = 0, perf: dict[str, float] | None = None,
               ended_s: float | None = None) -> None:
        """One finished request for the controller's gate and autoscaler (wall-clock time, so the controller can
        window it; ended_s: when it ended, monotonic, default now)."""
        gaps = timing.gaps_s
        perf = perf or {}
        self.samples.append(RequestSample(
            t=time.time() - (0.0 if ended_s is None else max(0.0, time.monotonic() - ended_s)), revision=revision, ok=error_kind is None, error_kind=error_kind, ttft_s=timing.ttft_s,
            tpot_s=timing.tpot_s, num_tokens=len(timing.token_times_s), num_prompt_tokens=num_prompt_tokens,
            prefill_queue_s=perf.get("prefill_queue_s"), decode_queue_s=perf.get("decode_queue_s"),
            itl_p50_s=quantile(gaps, 0.5), itl_p90_s=quantile(gaps, 0.9), itl_max_s=max(gaps, default=None),
            prefill_instance=instances[0], decode_instance=instances[1]))

    def timings_later(self, where: tuple[str, str], sub_requests: tuple[str, str]) -> list[tuple[RoleTransport, str]]:
        """The (client, sub-request) pairs of a finished request whose instances report timings only afterwards
        (trtllm-serve's /perf_metrics)."""
        out = []
        for instance, sub in zip(where, sub_requests):
            client = self.clients.get(instance) if instance and sub else None
            if client is not None and client.reports_perf_later:
                out.append((client, sub))
        return out

    def finish_later(self, pending: list[tuple[RoleTransport, str]], finish) -> None:
        """Runs `finish(perf)` once the instances' timings of a finished request are read (bounded: what has not
        come within PERF_WAIT_S is left out), off the request's path."""
        async def gather() -> None:
            perf: dict[str, float] = {}
            try:
                parts = await asyncio.wait_for(asyncio.gather(*(c.request_perf(sub) for c, sub in pending)),
                                               PERF_WAIT_S)
                for part in parts:
                    perf.update(part)
            except asyncio.TimeoutError:
                log.info("instance timings not read within %.1f s; the request is recorded without them", PERF_WAIT_S)
            finish(perf)
        task = asyncio.get_running_loop().create_task(gather())
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)

    def samples_since(self, since_s: float) -> list[RequestSample]:
        return [s for s in self.samples if s.t >= since_s]

    def record(self, timing: RequestTiming, perf: dict[str, float], ended_s: float | None = None) -> None:
        """ended_s: when the request ended (monotonic; default now)."""
        m, now = self.metrics, time.monotonic() if ended_s is None else ended_s
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
                m.breakdown.labels(phase).observe(perf[name])
        if "kv_transfer_bytes" in perf:
            m.kv_bytes.inc(perf["kv_transfer_bytes"])
        if "kv_transfer_s" in perf:
            m.kv_seconds.observe(perf["kv_transfer_s"])
        m.finished.inc()
        if timing.meets(self.config.slo):
            m.slo_met.inc()


class ServedRequest:
    """One request through the fleet service: its admission ticket (admitted by the caller, so that a refusal
    is answered before anything streams), its cohort (the canary split when it enters), the orchestrator's
    steps, its timing; `close()` records its metrics (when it succeeded) and its sample, cancels what still
    runs on the instances and releases its slot, exactly once, however it ended."""

    def __init__(self, service: FleetService, ticket: Ticket, request_id: str, prompt_ids: list[int],
                 sampling: SamplingInputs, arrival_s: float | None = None) -> None:
        self.service = service
        self.ticket = ticket
        self.request_id = request_id
        self.prompt_ids = prompt_ids
        self.sampling = sampling
        self.timing = RequestTiming(time.monotonic() if arrival_s is None else arrival_s)
        self.perf: dict[str, float] = {}
        self.where = ("", "")                 # (prefill instance, decode or colocated instance)
        self.sub_requests = ("", "")          # the sub-requests' ids there
        self.error_kind: str | None = "cancelled"   # until it fails with a kind or its consumer says it succeeded
        self.cohort = None
        self._steps = None          # the orchestrator's generator
        self._iterating = None      # steps()'s
        self._closed = False

    def steps(self) -> AsyncIterator[Generated]:
        """The orchestrator's steps once the ticket holds a slot; OrchestratorError as it raises it. Iterate it
        once; close() ends it if its consumer stopped early."""
        self._iterating = self._iterate()
        return self._iterating

    async def _iterate(self) -> AsyncIterator[Generated]:
        await self.ticket.enter()
        self.cohort = self.service.cohort()   # once admitted: the split as it is when the request starts
        self._steps = self.service.orchestrator.generate(self.request_id, self.prompt_ids, self.sampling,
                                                         self.cohort)
        try:
            async for out in self._steps:
                self.where = (out.prefill_instance or "", out.decode_instance or "")
                self.sub_requests = out.sub_requests
                if out.token_ids:
                    self.timing.add_tokens(len(out.token_ids), time.monotonic())
                self.perf.update(out.perf)
                yield out
        except OrchestratorError as exc:
            self.error_kind = exc.kind
            raise
        except Exception:
            self.error_kind = "internal"
            raise

    def _finish(self, perf: dict[str, float], ended_s: float) -> None:
        """Its metrics and sample, with the timings the instances reported (on its chunks, or afterwards)."""
        perf = {**self.perf, **perf}
        if self.error_kind is None:
            self.service.record(self.timing, perf, ended_s)
        # the revision that served it (a request the split handed to the other cohort counts there)
        self.service.sample(self.timing, self.cohort.revision if self.cohort else 0, self.error_kind,
                            self.where, len(self.prompt_ids), perf, ended_s)

    def succeeded(self) -> None:
        """Its consumer got what it asked for (the last token, or a stop string ended it early)."""
        self.error_kind = None

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            ended_s = time.monotonic()
            later = self.service.timings_later(self.where, self.sub_requests) if self.error_kind is None else []
            if later:    # trtllm-serve: the TTFT breakdown is read from the workers once they have recorded it
                self.service.finish_later(later, lambda perf: self._finish(perf, ended_s))
            else:
                self._finish({}, ended_s)
            if self._iterating is not None:
                await self._iterating.aclose()
            if self._steps is not None:   # cancels the instances' streams if it stopped early
                await self._steps.aclose()
        finally:
            self.ticket.release()
