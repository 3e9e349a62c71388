"""What to simulate: the roles, their instance counts, performance models, schedulers and the KV link."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from trtpd.perf.model import PerfModel, SharedCoresSpec
from trtpd.sched.continuous import BatchSchedulerConfig
from trtpd.sched.prefill import PrefillSchedulerConfig


@dataclass(frozen=True)
class PrefillRole:
    num_instances: int
    perf: PerfModel
    kv_capacity_tokens: int
    scheduler: PrefillSchedulerConfig


@dataclass(frozen=True)
class BatchRole:
    """Decode role (prefill_in_step=False) or colocated role (prefill_in_step=True)."""

    num_instances: int
    perf: PerfModel
    kv_capacity_tokens: int
    scheduler: BatchSchedulerConfig


@dataclass(frozen=True)
class KvLinkSpec:
    bytes_per_s: float             # one decode instance's ingress (all its devices together)
    latency_s: float = 0.0         # fixed cost per transfer (handshake, first byte)
    kv_bytes_per_token: int = 0    # whole request, all layers and shards, in the KV dtype


@dataclass(frozen=True)
class ClusterSpec:
    mode: Literal["disaggregated", "colocated"]
    prefill: PrefillRole | None = None
    decode: BatchRole | None = None          # disaggregated: decode; colocated: the colocated role
    kv_link: KvLinkSpec | None = None
    tokens_per_block: int = 32
    first_token_at: Literal["prefill", "decode"] = "decode"
    routing: Literal["least_loaded", "round_robin"] = "least_loaded"
    # the routing core's knobs (trtpd.routing.core.RoutingPolicy); instances are named prefill-<i>,
    # decode-<i>, colocated-<i>. Buckets: (max prompt tokens inclusive, prefill instance names).
    prefill_buckets: tuple[tuple[int, tuple[str, ...]], ...] = ()
    decode_load: Literal["sequences", "free_kv_blocks"] = "sequences"
    response_latency_s: float = 0.0   # the serving path delays every response by this (measured)
    # the instances compute on one host's cores, shared with the serving path (the CPU reference fleet; measured):
    # steps run longer while the host is oversubscribed (trtpd.sim.shared_cores); None on GPUs
    shared_cores: SharedCoresSpec | None = None
    # colocated step policy (trtpd.sim.colocated_instance): inflight (whole prompts join decode steps),
    # chunked (a token budget per step, decode first, then prompt chunks), prefill_first (vLLM 0.2)
    colocated_policy: Literal["inflight", "chunked", "prefill_first"] = "inflight"

    def __post_init__(self) -> None:
        if self.decode is None:
            raise ValueError("a cluster needs a decode (or colocated) role")
        if self.mode == "disaggregated" and (self.prefill is None or self.kv_link is None):
            raise ValueError("a disaggregated cluster needs a prefill role and a kv_link")
        if self.mode == "colocated" and not self.decode.scheduler.prefill_in_step:
            raise ValueError("a colocated role needs BatchSchedulerConfig(prefill_in_step=True)")
        if self.mode == "colocated" and self.prefill_buckets:
            raise ValueError("prefill_buckets route to prefill instances: a colocated cluster has none")

    @property
    def num_devices(self) -> int:
        """Instances x TP is the planner's business; here: instances (TP is inside each perf model)."""
        n = self.decode.num_instances if self.decode else 0
        return n + (self.prefill.num_instances if self.prefill and self.mode == "disaggregated" else 0)
