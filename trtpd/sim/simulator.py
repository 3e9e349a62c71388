"""Runs a workload through a cluster: arrivals -> router -> prefill -> KV link -> decode (or colocated).

Routing is the routing core's (trtpd.routing.core.Router), as in the gateway: the router gets one
snapshot of the instances at the start (idle, all KV free) and from then on counts what it sent
itself, told when a prefill answers (prefill_done) and when a request finishes (release), which is
exactly each instance's load in the simulation.
"""

from __future__ import annotations

from dataclasses import dataclass

from trtpd.routing.core import InstanceView, Router, RoutingPolicy
from trtpd.sim.cluster import ClusterSpec
from trtpd.sim.colocated_instance import ColocatedInstance
from trtpd.sim.decode_instance import DecodeInstance, KvLink
from trtpd.sim.events import EventLoop
from trtpd.sim.prefill_instance import PrefillInstance
from trtpd.sim.records import RequestRecords
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


class _Overloaded(Exception):
    pass


def _blocks(kv_capacity_tokens: int, tokens_per_block: int) -> int:
    return max(1, kv_capacity_tokens // tokens_per_block)


class Simulator:
    def __init__(self, cluster: ClusterSpec, requests: RequestArrays, exact_steps: bool = False,
                 max_in_system: int | None = None) -> None:
        """max_in_system: stop once more requests than this are waiting or running (an overloaded
        configuration's queue only grows; the requests not finished count as SLO misses)."""
        self.cluster = cluster
        self.max_in_system = max_in_system
        self.requests = requests
        self.loop = EventLoop()
        self.records = RequestRecords(requests)
        self.prefills: list[PrefillInstance] = []
        self.decodes: list[DecodeInstance] = []
        self.colocated: list[ColocatedInstance] = []
        c, tpb = cluster, cluster.tokens_per_block
        assert c.decode is not None
        if c.mode == "disaggregated":
            assert c.prefill is not None and c.kv_link is not None
            self.prefills = [PrefillInstance(i, self.loop, c.prefill.perf, c.prefill.scheduler,
                                             c.prefill.kv_capacity_tokens, self.records, self._on_prefilled)
                             for i in range(c.prefill.num_instances)]
            self.decodes = [DecodeInstance(i, self.loop, c.decode.perf, c.decode.scheduler,
                                           _blocks(c.decode.kv_capacity_tokens, tpb), tpb,
                                           KvLink(c.kv_link.bytes_per_s, c.kv_link.latency_s),
                                           c.kv_link.kv_bytes_per_token, self.records,
                                           c.first_token_at == "decode", self._on_kv_pulled, exact_steps,
                                           self._contention if c.decode_contention else None, self._on_finished)
                            for i in range(c.decode.num_instances)]
        else:
            self.colocated = [ColocatedInstance(i, self.loop, c.decode.perf, c.decode.scheduler,
                                                _blocks(c.decode.kv_capacity_tokens, tpb), tpb, self.records,
                                                exact_steps, self._on_colocated_prefilled, self._on_finished)
                              for i in range(c.decode.num_instances)]
        self.router = Router(routing_policy(cluster))
        self.router.update(_views(cluster), 0.0)
        self._ids = [str(i) for i in range(len(requests))]
        self._by_name = {**{f"prefill-{p.index}": p for p in self.prefills},
                         **{f"decode-{d.index}": d for d in self.decodes},
                         **{f"colocated-{d.index}": d for d in self.colocated}}
        if c.mode == "disaggregated":
            assert c.prefill is not None
            self._max_prompt_tokens = min(c.prefill.scheduler.max_num_tokens, c.prefill.kv_capacity_tokens)
        else:
            self._max_prompt_tokens = c.decode.scheduler.max_num_tokens
        self._max_seq_tokens = _blocks(c.decode.kv_capacity_tokens, tpb) * tpb
        self.num_rejected = 0
        self._first_token_at_prefill = cluster.first_token_at == "prefill"

    # -- routing -----------------------------------------------------------------------------------
    def _on_arrival(self, now_s: float, index: int) -> None:
        r = self.records
        if r.input_tokens[index] > self._max_prompt_tokens or \
                r.input_tokens[index] + r.output_tokens[index] > self._max_seq_tokens:
            self.num_rejected += 1      # never served: counts as unfinished and as an SLO miss
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
            return
        self._by_name[route.instance].add(now_s, index)

    def _on_prefilled(self, now_s: float, index: int) -> None:
        r = self.records
        if self._first_token_at_prefill:
            r.first_token_s[index] = now_s
        request_id = self._ids[index]
        self.router.prefill_done(request_id)
        route = self.router.pick_decode(request_id, r.input_tokens[index], r.output_tokens[index], now_s)
        if route is None:
            raise AssertionError(f"request {index}: no decode instance can hold it (checked on arrival)")
        self._by_name[route.instance].add(now_s, index)

    def _on_colocated_prefilled(self, index: int) -> None:
        self.router.prefill_done(self._ids[index])

    def _on_finished(self, index: int) -> None:
        self.router.release(self._ids[index])

    def _contention(self) -> float:
        """Slowdown factor of a decode step that starts now (shared cores: a prefill batch computing)."""
        return 1.0 + self.cluster.decode_contention if any(p.is_busy for p in self.prefills) else 1.0

    def _on_kv_pulled(self, now_s: float, index: int) -> None:
        self.prefills[self.records.prefill_instance[index]].release_kv(now_s, self.records.input_tokens[index])

    # -- run ---------------------------------------------------------------------------------------
    def run(self) -> SimRun:
        overloaded = False
        try:
            self.loop.run(self.requests.arrival_s, self._on_arrival)
        except _Overloaded:
            overloaded = True
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
        return SimRun(self.records, usage, links, span, self.loop.num_events, self.num_rejected, overloaded)


def default_max_in_system(cluster: ClusterSpec) -> int:
    """Twenty times what the cluster can hold in its batches, plus 1,000."""
    held = cluster.decode.num_instances * cluster.decode.scheduler.max_batch_size if cluster.decode else 0
    if cluster.prefill is not None:
        held += cluster.prefill.num_instances * cluster.prefill.scheduler.max_batch_size
    return 20 * held + 1000


def routing_policy(cluster: ClusterSpec) -> RoutingPolicy:
    return RoutingPolicy(prefill_buckets=cluster.prefill_buckets, balance=cluster.routing,
                         decode_load=cluster.decode_load)


def _views(cluster: ClusterSpec) -> list[InstanceView]:
    """The instances as idle snapshots. Prefill KV is counted in tokens here and the simulator refuses
    too-long prompts itself, so prefill views leave max_kv_blocks unknown (0)."""
    tpb, batch = cluster.tokens_per_block, cluster.decode
    assert batch is not None
    blocks = _blocks(batch.kv_capacity_tokens, tpb)
    role = "decode" if cluster.mode == "disaggregated" else "colocated"
    views = [InstanceView(f"{role}-{i}", role, free_kv_blocks=blocks, max_kv_blocks=blocks,
                          max_batch_size=batch.scheduler.max_batch_size, tokens_per_block=tpb)
             for i in range(batch.num_instances)]
    if cluster.mode == "disaggregated" and cluster.prefill is not None:
        views += [InstanceView(f"prefill-{i}", "prefill", max_batch_size=cluster.prefill.scheduler.max_batch_size,
                               tokens_per_block=tpb) for i in range(cluster.prefill.num_instances)]
    return views


def simulate(cluster: ClusterSpec, requests: RequestArrays, exact_steps: bool = False,
             max_in_system: int | None = None) -> SimRun:
    return Simulator(cluster, requests, exact_steps, max_in_system).run()
