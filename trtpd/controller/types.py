"""Typed data the controller's pure cores and its executors exchange (no I/O here).

Lifecycle of one instance (seed 000 §4.5's fleet, with the controller's states):

    starting ──ready──▶ ready ──drain──▶ draining ──holds 0 / drain timeout──▶ stopped
        │                 │                  │
        └──── dies, fails health checks, start timeout ──────▶ failed (then stopped; a new one replaces it)

`holds` is what still needs an instance before it may stop: for prefill the KV exports it holds (until
pulled or expired) plus requests queued or prefilling; for decode the streams it serves plus requests
queued; for colocated both. The gateway's router adds what it sent and has not yet seen finish.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

from trtpd.schema.fleet_file import WORLD   # one name for the controller's unit and the gateway's fleet file

LIFECYCLE = ("starting", "ready", "draining", "stopped", "failed")
ROLES = ("prefill", "decode", "colocated")
# backend tensorrt-llm: the controller's unit is a Triton MPI world, one server process holding every prefill and
# decode instance of a revision (the backend's KV moves over MPI inside that world only; DESIGN.md decision 1)
UNITS = (*ROLES, WORLD)          # what an instance row's `role` can be
ActionKind = Literal["start", "drain", "stop", "replace", "set_traffic", "promote", "rollback", "apply_in_place"]


@dataclass(frozen=True)
class RoleShape:
    """What one role's instances of one revision run (everything that needs a restart to change)."""

    role: str                    # prefill | decode | colocated
    engine_dir: str
    config_hash: str             # hash over everything below and the engine's config: equal = same instance
    kv_signature: str            # KV layout (dtype, layers, heads, head_dim, tokens_per_block): equal = compatible
    cpus_per_instance: int = 1   # cores (reference backend)
    gpus_per_instance: int = 0   # GPU path: tp * pp
    tp: int = 1
    max_batch_size: int = 64
    kv_transport: str = "shm"
    kv_transfer_timeout_ms: int = 30000
    step_delay_ms: int = 0       # fault injection: a pause after each engine step (rollout gate tests)
    backend: str = "reference"   # what an instance is: a tritonserver (reference) or a trtllm-serve worker
    # on GPUs (a spec's gpus section; all empty: the CPU twin): the inventory the instances' GPU sets come from, and
    # the serve-pytorch/ folder and command that start each worker (trtpd/fleet/gpu_workers.py)
    gpu_ids: tuple[int, ...] = ()
    serve_dir: str = ""
    serve_command: tuple[str, ...] = ()
    # a world (role WORLD): the shape and instance count of each role it holds, in role order (else empty)
    world_roles: tuple[tuple["RoleShape", int], ...] = ()


@dataclass(frozen=True)
class ObservedInstance:
    """One instance as the executor sees it now."""

    name: str                    # "<role>-<n>" (n never reused within a deployment), the `instance` metrics label
    role: str
    revision: int
    alive: bool                  # the process / pod exists
    ready: bool                  # health endpoint answers ready and its metrics answer
    holds: int = 0               # see the module docstring; -1: unknown (treated as busy)
    reason: str = ""             # why not alive / not ready, when known


@dataclass(frozen=True)
class InstanceRow:
    """One instance in the controller's instance table (its lifecycle state, kept across restarts)."""

    name: str
    role: str
    revision: int
    state: str                   # one of LIFECYCLE
    since_s: float               # wall-clock time it entered `state`
    reason: str = ""
    detail: dict = field(default_factory=dict)   # executor's record (pid, ports, pod name, ...)


@dataclass(frozen=True)
class TrafficSplit:
    """Which requests go to the canary revision: `canary_share` of them, deterministically spread (request n is
    a canary request when floor((n+1)*share) > floor(n*share)). Roles in `changed_roles` use only instances of
    their cohort's revision; other roles are shared by both cohorts (their KV is compatible; lint checked)."""

    stable_revision: int
    canary_revision: int = 0      # 0: no canary
    canary_share: float = 0.0
    changed_roles: tuple[str, ...] = ()
    canary_instances: tuple[str, ...] = ()   # the canary's instances of the changed roles (ready ones)


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    instance: str = ""            # drain / stop / replace
    role: str = ""                # start
    revision: int = 0             # start, promote, rollback, apply_in_place
    force: bool = False           # stop: do not wait (drain timeout, failed instance)
    traffic: TrafficSplit | None = None   # set_traffic
    reason: str = ""


class Executor(Protocol):
    """Every side effect of the controller goes through this (local processes, Kubernetes, or a test's fake)."""

    def observe(self) -> list[ObservedInstance]:
        """Every instance of the deployment that exists now, with health and holds."""
        ...

    def start(self, name: str, role: str, revision: int, shape: RoleShape) -> dict:
        """Starts one instance (returns without waiting for readiness); returns its record (InstanceRow.detail)."""
        ...

    def drain(self, name: str) -> None:
        """The router sends it no new request from now on; what it holds finishes."""
        ...

    def stop(self, name: str, force: bool = False, reason: str = "") -> None:
        """Stops it (force: at once, without waiting for what it holds) and forgets it; `reason` is what the
        requests still there are told."""
        ...

    def set_traffic(self, split: TrafficSplit) -> None:
        """Tells the router which revision serves which share of requests."""
        ...

    def apply_in_place(self, settings: dict) -> None:
        """Settings that need no restart (today: {"routing": RoutingPolicy fields}), for the router to apply."""
        ...

    def relabel(self, names: list[str], revision: int) -> None:
        """After a promotion (or a change applied in place): the instances `names`, kept as they are, now belong
        to `revision` wherever the executor records an instance's revision (an executor with no such record
        does nothing)."""
        ...

    def wait_stopped(self) -> None:
        """When the controller process ends: returns once the stops it asked for have finished (an executor whose
        stops run elsewhere, e.g. Kubernetes, returns at once)."""
        ...
