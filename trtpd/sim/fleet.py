"""The simulated instances: by role and by name, each one's life, and what the router sees of them.

Instances are created at the start of a run and, with a scaler, during it (trtpd.sim.scaling describes
their life). Indexes are never reused, so a request's `prefill_instance` / `decode_instance` stays valid
after its instance is removed. The router gets every ready and draining instance (a draining one keeps
Router.set_state's sticky override); a starting one joins once its start-up is over.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from trtpd.routing.core import InstanceView, Router
from trtpd.sim.cluster import ClusterSpec
from trtpd.sim.events import EventLoop
from trtpd.sim.scaling import InstanceLife, ScaleEvent

Instance = Any   # PrefillInstance | DecodeInstance | ColocatedInstance (trtpd.sim.*_instance)


def blocks(kv_capacity_tokens: int, tokens_per_block: int) -> int:
    return max(1, kv_capacity_tokens // tokens_per_block)


class Fleet:
    def __init__(self, cluster: ClusterSpec, loop: EventLoop, router: Router,
                 make: Callable[[str, int], Instance]) -> None:
        """make(role, index): a new instance of that role (the simulator wires its callbacks)."""
        self.cluster = cluster
        self.loop = loop
        self.router = router
        self.make = make
        self.by_role: dict[str, list] = {"prefill": [], "decode": [], "colocated": []}
        self.by_name: dict[str, Instance] = {}
        self.lives: dict[str, InstanceLife] = {}
        self.events: list[ScaleEvent] = []
        self.num_draining = 0

    @property
    def roles(self) -> tuple[str, ...]:
        return ("prefill", "decode") if self.cluster.mode == "disaggregated" else ("colocated",)

    def create(self, role: str, now_s: float, ready: bool) -> InstanceLife:
        group = self.by_role[role]
        index = len(group)
        instance = self.make(role, index)
        group.append(instance)
        name = f"{role}-{index}"
        self.by_name[name] = instance
        life = self.lives[name] = InstanceLife(name, role, index, now_s, now_s if ready else float("nan"))
        return life

    def counted(self, role: str) -> list[InstanceLife]:
        """Starting and ready instances of the role (what a target count counts)."""
        return [life for life in self.lives.values() if life.role == role and life.state in ("starting", "ready")]

    def of_state(self, role: str, state: str) -> list[InstanceLife]:
        return [life for life in self.lives.values() if life.role == role and life.state == state]

    # -- the router's view -------------------------------------------------------------------------
    def views(self) -> list[InstanceView]:
        """Idle snapshots of the ready and draining instances. Prefill KV is counted in tokens and the
        simulator refuses too-long prompts itself, so prefill views leave max_kv_blocks unknown (0)."""
        c, tpb = self.cluster, self.cluster.tokens_per_block
        assert c.decode is not None
        kv_blocks = blocks(c.decode.kv_capacity_tokens, tpb)
        views = []
        for life in self.lives.values():
            if life.state not in ("ready", "draining"):
                continue
            if life.role == "prefill":
                assert c.prefill is not None
                views.append(InstanceView(life.name, "prefill", max_batch_size=c.prefill.scheduler.max_batch_size,
                                          tokens_per_block=tpb))
            else:
                views.append(InstanceView(life.name, life.role, free_kv_blocks=kv_blocks, max_kv_blocks=kv_blocks,
                                          max_batch_size=c.decode.scheduler.max_batch_size, tokens_per_block=tpb))
        return views

    # -- scaling -----------------------------------------------------------------------------------
    def apply(self, now_s: float, targets: Mapping[str, int], startup_s: float) -> None:
        """Starts or drains instances until each role's starting + ready count is its target."""
        for role in sorted(targets):
            if role not in self.roles:
                raise ValueError(f"a scaler asked for {targets[role]} {role} instances; this cluster's roles are "
                                 f"{', '.join(self.roles)}")
            want = targets[role]
            if want < 1:
                raise ValueError(f"a scaler asked for {want} {role} instances; each role needs at least 1")
            have = self.counted(role)
            for _ in range(want - len(have)):
                life = self.create(role, now_s, ready=False)
                self.loop.push(now_s + startup_s, self._start_done, life)
            for life in self._victims(have, len(have) - want):
                self.drain(now_s, life)
            if want != len(have):
                self.events.append(ScaleEvent(now_s, role, len(have), want))

    def _victims(self, lives: list[InstanceLife], num: int) -> list[InstanceLife]:
        """Starting instances first (newest first), then the ready ones holding least work (newest first)."""
        if num <= 0:
            return []
        starting = sorted((x for x in lives if x.state == "starting"), key=lambda x: -x.index)
        ready = sorted((x for x in lives if x.state == "ready"), key=lambda x: (self.load(x), -x.index))
        return (starting + ready)[:num]

    def _start_done(self, now_s: float, life: InstanceLife) -> None:
        if life.state == "starting":
            life.ready_s = now_s
            self.router.update(self.views(), now_s)

    def drain(self, now_s: float, life: InstanceLife) -> None:
        was = life.state
        life.drain_s = now_s
        if was == "starting":       # it never took a request
            life.removed_s = now_s
        elif not self.load(life):
            self._remove(now_s, life)
        else:
            self.num_draining += 1
            self.router.set_state(life.name, "draining")

    def remove_if_idle(self, name: str) -> None:
        """Called when an instance may have finished its last work."""
        life = self.lives[name]
        if life.state == "draining" and not self.load(life):
            self.num_draining -= 1
            self._remove(self.loop.now_s, life)

    def _remove(self, now_s: float, life: InstanceLife) -> None:
        life.removed_s = now_s
        self.router.update(self.views(), now_s)

    def load(self, life: InstanceLife) -> int:
        """What the instance still holds: prefill: queued tokens plus KV not yet pulled; else sequences."""
        instance = self.by_name[life.name]
        if life.role == "prefill":
            assert self.cluster.prefill is not None
            held_kv = self.cluster.prefill.kv_capacity_tokens - instance.free_kv_tokens
            return instance.queued_tokens + held_kv + int(instance.is_busy)
        return instance.num_assigned
