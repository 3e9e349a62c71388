"""Runs a workload through a cluster: arrivals -> router -> prefill -> KV link -> decode (or colocated).

Routing is the routing core's (trtpd.routing.core.Router), as in the gateway: the router gets one
snapshot of the instances at the start (idle, all KV free) and from then on counts what it sent
itself, told when a prefill answers (prefill_done) and when a request finishes (release), which is
exactly each instance's load in the simulation.

With a scaler (trtpd.sim.scaling), instance counts change during the run: every `interval_s` the
simulator measures what a live controller would and applies the target counts the scaler answers;
an added instance takes requests after `startup_s`, a removed one is drained first (trtpd.sim.fleet).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trtpd.routing.core import Router, RoutingPolicy
from trtpd.sim.attainment import AttainmentWatch
from trtpd.sim.cluster import ClusterSpec
from trtpd.sim.colocated_instance import ColocatedInstance
from trtpd.sim.decode_instance import DecodeInstance, KvLink
from trtpd.sim.events import EventLoop
from trtpd.sim.fleet import Fleet, blocks as _blocks
from trtpd.sim.prefill_instance import PrefillInstance
from trtpd.sim.records import RequestRecords
from trtpd.sim.scaling import (FleetMetrics, InstanceLife, RoleMetrics, ScaleEvent, Scaler, ScalingOptions,
                               window_latencies)
from trtpd.sim.shared_cores import SharedCores
from trtpd.sim.workload import RequestArrays


@dataclass(frozen=True)
class InstanceUsage:
    role: str
    index: int
    busy_share: float          # share of the simulated span the instance was computing
    mean_batch_size: float     # decode/colocated: mean sequences per step; prefill: 0


@dataclass
class SimRun:
    records: RequestRecords
    usage: list[InstanceUsage]
    link_busy_share: list[float]
    span_s: float
    num_events: int
    num_rejected: int = 0      # prompts longer than the entry role accepts (the gateway refuses them)
    stopped_overloaded: bool = False   # stopped early: more requests in the system than max_in_system
    instances: list[InstanceLife] = field(default_factory=list)   # every instance the run had
    scale_events: list[ScaleEvent] = field(default_factory=list)  # count changes a scaler made
    end_s: float = 0.0         # simulated time of the last event

    def instance_seconds(self, role: str | None = None) -> float:
        """Seconds instances held their devices (starting and draining included), summed."""
        return sum(life.held_s(self.end_s) for life in self.instances if role in (None, life.role))


class _Overloaded(Exception):
    pass


class Simulator:
    def __init__(self, cluster: ClusterSpec, requests: RequestArrays, exact_steps: bool = False,
                 max_in_system: int | None = None, scaler: Scaler | None = None,
                 scaling: ScalingOptions = ScalingOptions(), inline_steps: bool = True) -> None:
        """max_in_system: stop once more requests than this are waiting or running (an overloaded
        configuration's queue only grows; the requests not finished count as SLO misses).
        scaler: asked for target instance counts every scaling.interval_s (trtpd.sim.scaling).
        inline_steps: run decode-only steps that nothing can interrupt without the event heap
        (trtpd.sim.stepping; the same run either way, False for the tests that show it)."""
        self.cluster = cluster
        self.inline_steps = inline_steps
        self.max_in_system = max_in_system
        self.requests = requests
        self.exact_steps = exact_steps
        self.scaler = scaler
        self.scaling = scaling
        self.loop = EventLoop()
        self.records = RequestRecords(requests)
        c, tpb = cluster, cluster.tokens_per_block
        assert c.decode is not None
        self.router = Router(routing_policy(cluster))
        self.shared = SharedCores(c.shared_cores, self.loop) if c.shared_cores is not None else None
        self.fleet = Fleet(cluster, self.loop, self.router, self._make_instance)
        self.prefills: list[PrefillInstance] = self.fleet.by_role["prefill"]
        self.decodes: list[DecodeInstance] = self.fleet.by_role["decode"]
        self.colocated: list[ColocatedInstance] = self.fleet.by_role["colocated"]
        if c.mode == "disaggregated":
            assert c.prefill is not None and c.kv_link is not None
            for _ in range(c.prefill.num_instances):
                self.fleet.create("prefill", 0.0, ready=True)
        for _ in range(c.decode.num_instances):
            self.fleet.create("decode" if c.mode == "disaggregated" else "colocated", 0.0, ready=True)
        self.router.update(self.fleet.views(), 0.0)
        self._ids = [str(i) for i in range(len(requests))]
        self._by_name = self.fleet.by_name
        if c.mode == "disaggregated":
            assert c.prefill is not None
            self._max_prompt_tokens = min(c.prefill.scheduler.max_num_tokens, c.prefill.kv_capacity_tokens)
        elif c.colocated_policy == "chunked":
            self._max_prompt_tokens = c.decode.kv_capacity_tokens    # prompts span steps; KV binds
        else:
            self._max_prompt_tokens = c.decode.scheduler.max_num_tokens
        self._max_seq_tokens = _blocks(c.decode.kv_capacity_tokens, tpb) * tpb
        self.num_rejected = 0
        self._first_token_at_prefill = cluster.first_token_at == "prefill"
        self.watch: AttainmentWatch | None = None      # told of each finished or refused request
        self._has_started = self._has_ended = self.overloaded = False
        self._busy_at_tick: dict[str, float] = {}

    def _make_instance(self, role: str, i: int):
        c, tpb = self.cluster, self.cluster.tokens_per_block
        assert c.decode is not None
        if role == "prefill":
            assert c.prefill is not None
            return PrefillInstance(i, self.loop, c.prefill.perf, c.prefill.scheduler, c.prefill.kv_capacity_tokens,
                                   self.records, self._on_prefilled, self.shared)
        if role == "decode":
            assert c.kv_link is not None
            return DecodeInstance(i, self.loop, c.decode.perf, c.decode.scheduler,
                                  _blocks(c.decode.kv_capacity_tokens, tpb), tpb,
                                  KvLink(c.kv_link.bytes_per_s, c.kv_link.latency_s), c.kv_link.kv_bytes_per_token,
                                  self.records, c.first_token_at == "decode", self._on_kv_pulled, self.exact_steps,
                                  self.shared, self._on_finished, self.inline_steps)
        instance = ColocatedInstance(i, self.loop, c.decode.perf, c.decode.scheduler,
                                     _blocks(c.decode.kv_capacity_tokens, tpb), tpb, self.records, self.exact_steps,
                                     self._on_colocated_prefilled, self._on_finished, c.colocated_policy,
                                     self.inline_steps, self.shared)
        if self.scaler is None and self.shared is None:
            # only an arrival reaches a colocated instance (its peers' steps do not, unless they share its cores)
            instance.horizon_s = self.loop.next_arrival_s
            instance.late_admission = True
        return instance

    # -- routing -----------------------------------------------------------------------------------
    def _on_arrival(self, now_s: float, index: int) -> None:
        r = self.records
        if self.watch is not None:
            self.watch.late(now_s, index)
            if self.watch.passed is not None:
                self.loop.request_stop()
        if r.input_tokens[index] > self._max_prompt_tokens or \
                r.input_tokens[index] + r.output_tokens[index] > self._max_seq_tokens:
            self.num_rejected += 1      # never served: counts as unfinished and as an SLO miss
            r.rejected[index] = True
            self._refused(index)
            return
        if self.max_in_system is not None and index - self.num_rejected - r.num_done > self.max_in_system:
            raise _Overloaded
        request_id = self._ids[index]
        if self.colocated:
            route = self.router.pick_colocated(request_id, r.input_tokens[index], r.output_tokens[index], now_s)
        else:
            route = self.router.pick_prefill(request_id, r.input_tokens[index], now_s)
        if route is None:               # no instance serves this length (prefill buckets): refused
            self.num_rejected += 1
            r.rejected[index] = True
            self._refused(index)
            return
        instance = self._by_name[route.instance]
        if self.colocated:
            r.decode_instance[index] = instance.index
        if self.shared is not None:    # the serving path's work for the request, on the cores the engines share
            self.shared.serve(now_s, self.shared.spec.serving_cpu_per_request_s)
        instance.add(now_s, index)

    def _on_prefilled(self, now_s: float, index: int) -> None:
        r = self.records
        if self._first_token_at_prefill:
            r.first_token_s[index] = now_s
        request_id = self._ids[index]
        self.router.prefill_done(request_id)
        route = self.router.pick_decode(request_id, r.input_tokens[index], r.output_tokens[index], now_s)
        if route is None:
            raise AssertionError(f"request {index}: no decode instance can hold it (checked on arrival)")
        instance = self._by_name[route.instance]
        r.decode_instance[index] = instance.index
        instance.add(now_s, index)

    def _on_colocated_prefilled(self, index: int) -> None:
        self.router.prefill_done(self._ids[index])

    def _refused(self, index: int) -> None:
        if self.watch is not None:
            self.watch.missed(index)
            if self.watch.passed is not None:
                self.loop.request_stop()

    def _on_finished(self, index: int) -> None:
        watch = self.watch
        if watch is not None:
            watch.finished(index)
            if watch.passed is not None:
                self.loop.request_stop()
        self.router.release(self._ids[index])
        if self.fleet.num_draining:
            role = "colocated" if self.colocated else "decode"
            self.fleet.remove_if_idle(f"{role}-{self.records.decode_instance[index]}")

    def _on_kv_pulled(self, now_s: float, index: int) -> None:
        prefill = self.records.prefill_instance[index]
        self.prefills[prefill].release_kv(now_s, self.records.input_tokens[index])
        if self.fleet.num_draining:
            self.fleet.remove_if_idle(f"prefill-{prefill}")

    # -- scaling -----------------------------------------------------------------------------------
    def _tick(self, now_s: float, _: object = None) -> None:
        assert self.scaler is not None
        targets = self.scaler(self._measure(now_s))
        if targets:
            self.fleet.apply(now_s, targets, self.scaling.startup_s)
        next_s = now_s + self.scaling.interval_s
        if next_s <= self.requests.arrival_s[-1]:
            self.loop.push(next_s, self._tick)

    def _measure(self, now_s: float) -> FleetMetrics:
        """What a live controller would read from the fleet now (trtpd.sim.scaling.FleetMetrics); busy
        shares are over the time since the previous call."""
        first_s = self.requests.arrival_s[0] if len(self.requests) else 0.0
        window_s = min(self.scaling.window_s, max(now_s - first_s, 1e-9))
        w = window_latencies(self.records, now_s, window_s, self.cluster.response_latency_s, self.scaling.quantile)
        roles = {}
        for role in self.fleet.roles:
            held = self.fleet.of_state(role, "ready") + self.fleet.of_state(role, "draining")
            busy = 0.0
            for life in held:
                busy_s = self._by_name[life.name].busy_s
                busy += busy_s - self._busy_at_tick.get(life.name, 0.0)
                self._busy_at_tick[life.name] = busy_s
            waiting = sum(_num_waiting(self._by_name[life.name]) for life in held)
            queue_s = w.decode_queue_p_s if role == "decode" else w.prefill_queue_p_s
            roles[role] = RoleMetrics(role, len(self.fleet.of_state(role, "ready")),
                                      len(self.fleet.of_state(role, "starting")),
                                      len(self.fleet.of_state(role, "draining")), waiting, queue_s,
                                      min(1.0, busy / (self.scaling.interval_s * max(1, len(held)))))
        return FleetMetrics(now_s, window_s, w.num_arrivals, w.mean_input_tokens, w.mean_output_tokens,
                            w.ttft_p_s, w.tpot_p_s, roles)

    # -- run ---------------------------------------------------------------------------------------
    def run_until_decided(self, watch: AttainmentWatch) -> bool:
        """From the start, runs until `watch` has decided the run's SLO attainment against its target,
        or to the end; True when the run has ended (then `watch.passed` may still be None: decide it from
        the run). run() afterwards goes on to the end, exactly as if it had not stopped."""
        if self._has_started:
            raise RuntimeError("run_until_decided: the watch must see the run from its start")
        self.watch = watch
        self._advance()
        self.watch = None
        return self._has_ended

    def _advance(self) -> None:
        if self._has_ended:
            return
        if not self._has_started:
            self._has_started = True
            if self.scaler is not None and len(self.requests):
                self.loop.push(self.requests.arrival_s[0] + self.scaling.interval_s, self._tick)
            arrivals: tuple = (self.requests.arrival_s, self._on_arrival)
        else:
            arrivals = ()
        try:
            self._has_ended = self.loop.run(*arrivals)
        except _Overloaded:
            for instance in self.colocated:
                instance.rewind_to(self.loop.now_s)
            self._has_ended = self.overloaded = True

    def run(self) -> SimRun:
        self._advance()
        overloaded = self.overloaded
        span = max(self.loop.now_s - (self.requests.arrival_s[0] if len(self.requests) else 0.0), 1e-12)
        usage = [InstanceUsage("prefill", p.index, p.busy_s / span, 0.0) for p in self.prefills]
        for role, group in (("decode", self.decodes), ("colocated", self.colocated)):
            usage += [InstanceUsage(role, d.index, d.busy_s / span, d.sum_batch_steps / max(d.num_steps, 1))
                      for d in group]
        links = [d.link.busy_s / span for d in self.decodes]
        delay = self.cluster.response_latency_s
        if delay:   # a pure delay on the way out: it shifts response times, not scheduling
            r = self.records
            r.first_token_s = [t + delay for t in r.first_token_s]
            r.done_s = [t + delay for t in r.done_s]
        return SimRun(self.records, usage, links, span, self.loop.num_events, self.num_rejected, overloaded,
                      list(self.fleet.lives.values()), list(self.fleet.events), self.loop.now_s)


def default_max_in_system(cluster: ClusterSpec) -> int:
    """Twenty times what the cluster can hold in its batches, plus 1,000."""
    held = cluster.decode.num_instances * cluster.decode.scheduler.max_batch_size if cluster.decode else 0
    if cluster.prefill is not None:
        held += cluster.prefill.num_instances * cluster.prefill.scheduler.max_batch_size
    return 20 * held + 1000


def routing_policy(cluster: ClusterSpec) -> RoutingPolicy:
    return RoutingPolicy(prefill_buckets=cluster.prefill_buckets, balance=cluster.routing,
                         decode_load=cluster.decode_load)


def _num_waiting(instance) -> int:
    """Requests queued at an instance, not yet in a batch."""
    if isinstance(instance, PrefillInstance):
        return instance.scheduler.num_waiting
    return len(instance.scheduler.waiting)


def simulate(cluster: ClusterSpec, requests: RequestArrays, exact_steps: bool = False,
             max_in_system: int | None = None, scaler: Scaler | None = None,
             scaling: ScalingOptions = ScalingOptions(), inline_steps: bool = True) -> SimRun:
    return Simulator(cluster, requests, exact_steps, max_in_system, scaler, scaling, inline_steps).run()
