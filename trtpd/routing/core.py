"""The routing core: picks the prefill, decode or colocated instance for each request and decides what
to do when a step fails. Pure: the caller passes snapshots of the instances and the time (`now_s`);
nothing here reads a clock, does I/O or starts a thread. The gateway calls it live, the simulator in
simulated time, so both route alike.

Load = the latest snapshot (`update`) plus what this router sent since and has not been told is done:
prompt tokens queued at a prefill (or colocated) instance until `prefill_done`, and KV blocks for
prompt + max_new_tokens reserved at a decode (or colocated) instance until `release`. A request's
tokens can be counted twice while a newer snapshot already includes them: routing errs towards
spreading load, and the overlap ends at `prefill_done` / `release`.

States: an instance's own state comes from its snapshot; the router keeps overrides on top:
- draining (set_state): sticky. update() keeps it until the instance is missing from an update (it
  is then forgotten) or the caller calls set_state(name, "ready"), which clears every override.
- unhealthy/starting (set_state, or on_failure with error_kind "unavailable"): until an update()
  with a later now_s than the mark says otherwise (a snapshot taken before the failure cannot
  bring a dead instance back).
Ties are broken by name, digit runs compared as numbers (prefill-2 before prefill-10).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import Iterable, Literal

from trtpd.routing.failures import FailureDecision, check_failure, decide_failure, no_alternative
from trtpd.routing.ordering import name_order_key

__all__ = ["FailureDecision", "InstanceView", "Route", "Router", "RouterLoad", "RoutingPolicy"]

ROLES = ("prefill", "decode", "colocated")
STATES = ("ready", "draining", "unhealthy", "starting")
NO_LIMIT = 1 << 62


@dataclass(frozen=True)
class InstanceView:
    """A snapshot of one instance, as the gateway reads it from the instance's metrics."""

    name: str                   # e.g. "prefill-0"
    role: str                   # "prefill" | "decode" | "colocated"
    state: str = "ready"        # "ready" | "draining" | "unhealthy" | "starting"
    waiting: int = 0            # requests queued at the instance
    active: int = 0             # sequences running (decode/colocated) or exports held (prefill)
    queued_prompt_tokens: int = 0   # prompt tokens waiting at a prefill instance (0 if unknown)
    free_kv_blocks: int = 0
    max_kv_blocks: int = 0      # 0: unknown (no request is refused for size)
    max_batch_size: int = 0
    tokens_per_block: int = 32
    # the instances it can exchange KV with: "" any; else only those with the same domain (a Triton MPI world: its
    # KV moves over MPI inside the world, so a request prefilled there is decoded there)
    kv_domain: str = ""

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"instance {self.name!r}: unknown role {self.role!r}; expected one of {', '.join(ROLES)}")
        if self.state not in STATES:
            raise ValueError(f"instance {self.name!r}: unknown state {self.state!r}; "
                             f"expected one of {', '.join(STATES)}")
        if self.tokens_per_block <= 0:
            raise ValueError(f"instance {self.name!r}: tokens_per_block must be positive, got {self.tokens_per_block}")


@dataclass(frozen=True)
class RoutingPolicy:
    # seed 000 §3.4 / seed 004 §6: prompt-length buckets mapped to prefill instance groups; empty = one group.
    # Each entry: (max_prompt_tokens inclusive, names of the prefill instances serving that bucket); a prompt
    # goes to the first bucket that fits; instances not named in any bucket serve every length.
    prefill_buckets: tuple[tuple[int, tuple[str, ...]], ...] = ()
    max_prefill_attempts: int = 2      # a KV pull that fails because prefill died: prefill again elsewhere, bounded
    max_decode_attempts: int = 1       # a decode instance that fails before the first token: try another? (1 = no)
    # additions (the simulator's router had these):
    balance: Literal["least_loaded", "round_robin"] = "least_loaded"
    # decode/colocated capacity signal for pick_decode: most free KV blocks (default), or fewest sequences
    # (snapshot active + waiting + sent by this router), which the simulator has always used
    decode_load: Literal["free_kv_blocks", "sequences"] = "free_kv_blocks"
    # a prompt whose bucket group has no instance available may use the next longer buckets' groups
    # (never a shorter one); off: it gets None (the caller answers 503)
    spill_to_longer_buckets: bool = False
    # equal loads: the first by name (reproducible runs; the simulator), or the one picked least recently
    # (live traffic: idle instances take turns instead of the first one taking every sequential request)
    tie_break: Literal["name", "least_recent"] = "name"

    def __post_init__(self) -> None:
        if self.max_prefill_attempts < 1 or self.max_decode_attempts < 1:
            raise ValueError("max_prefill_attempts and max_decode_attempts must be at least 1")
        if self.balance not in ("least_loaded", "round_robin"):
            raise ValueError(f"unknown balance {self.balance!r}; expected least_loaded or round_robin")
        if self.decode_load not in ("free_kv_blocks", "sequences"):
            raise ValueError(f"unknown decode_load {self.decode_load!r}; expected free_kv_blocks or sequences")
        if self.tie_break not in ("name", "least_recent"):
            raise ValueError(f"unknown tie_break {self.tie_break!r}; expected name or least_recent")
        _check_buckets(self.prefill_buckets)


def _check_buckets(buckets: tuple[tuple[int, tuple[str, ...]], ...]) -> None:
    seen: set[str] = set()
    previous = 0
    for max_prompt_tokens, names in buckets:
        if max_prompt_tokens <= previous:
            raise ValueError(f"prefill_buckets: max_prompt_tokens must be positive and increasing, got "
                             f"{max_prompt_tokens} after {previous}")
        previous = max_prompt_tokens
        if isinstance(names, str):
            raise ValueError(f"prefill_buckets: bucket {max_prompt_tokens} lists {names!r}, not a tuple of names")
        twice = seen.intersection(names)
        if twice:
            raise ValueError(f"prefill_buckets: {', '.join(sorted(twice))} in more than one bucket")
        seen.update(names)


@dataclass(frozen=True)
class Route:
    """Where one request goes."""

    request_id: str
    instance: str
    attempt: int                # 1-based: how many times this request was routed at this stage


@dataclass(frozen=True)
class RouterLoad:
    """What this router has sent to one instance and not yet been told is done."""

    pending_prompt_tokens: int
    reserved_kv_blocks: int
    num_requests: int           # decode/colocated requests not yet released


class _Slot:
    """One instance: its snapshot, its router-side override and what this router sent there."""

    __slots__ = ("name", "view", "order_key", "override", "override_s", "capacity_tokens",
                 "pending_prompt_tokens", "reserved_kv_blocks", "num_requests", "queued_tokens", "sequences",
                 "last_pick")

    def __init__(self, view: InstanceView) -> None:
        self.name = view.name
        self.order_key = name_order_key(view.name)
        self.override: str | None = None
        self.override_s = 0.0
        self.pending_prompt_tokens = 0     # sent by this router, not yet prefill_done
        self.reserved_kv_blocks = 0        # sent by this router, not yet released
        self.num_requests = 0              # decode/colocated requests sent, not yet released
        self.last_pick = 0                 # when this router last picked it (tie_break="least_recent")
        self.set_view(view)

    def set_view(self, view: InstanceView) -> None:
        """Kept up to date with every hold (the picks compare these): snapshot + this router's."""
        self.view = view
        self.capacity_tokens = view.max_kv_blocks * view.tokens_per_block if view.max_kv_blocks > 0 else NO_LIMIT
        self.queued_tokens = view.queued_prompt_tokens + self.pending_prompt_tokens
        self.sequences = view.active + view.waiting + self.num_requests

    @property
    def state(self) -> str:
        return self.override or self.view.state

    def blocks_for(self, num_tokens: int) -> int:
        tpb = self.view.tokens_per_block
        return (num_tokens + tpb - 1) // tpb


class _Request:
    """What one request holds: prompt tokens queued at one instance, KV blocks reserved at one."""

    __slots__ = ("num_prompt_tokens", "max_new_tokens", "prefill_slot", "prefill_tokens", "kv_slot", "kv_blocks",
                 "prefill_attempts", "decode_attempts", "excluded", "kv_domain")

    def __init__(self, num_prompt_tokens: int) -> None:
        self.num_prompt_tokens = num_prompt_tokens
        self.max_new_tokens = 0
        self.prefill_slot: _Slot | None = None
        self.prefill_tokens = 0
        self.kv_slot: _Slot | None = None
        self.kv_blocks = 0
        self.prefill_attempts = 0      # pick_prefill and pick_colocated calls
        self.decode_attempts = 0
        self.excluded: frozenset[str] = frozenset()
        self.kv_domain = ""            # the KV domain of the prefill instance last picked (InstanceView.kv_domain)

    def drop_prefill(self) -> None:
        slot = self.prefill_slot
        if slot is not None:
            slot.pending_prompt_tokens -= self.prefill_tokens
            slot.queued_tokens -= self.prefill_tokens
            self.prefill_slot, self.prefill_tokens = None, 0

    def hold_prefill(self, slot: _Slot, num_tokens: int) -> None:
        self.drop_prefill()
        self.prefill_slot, self.prefill_tokens = slot, num_tokens
        slot.pending_prompt_tokens += num_tokens
        slot.queued_tokens += num_tokens

    def drop_kv(self) -> None:
        slot = self.kv_slot
        if slot is not None:
            slot.reserved_kv_blocks -= self.kv_blocks
            slot.num_requests -= 1
            slot.sequences -= 1
            self.kv_slot, self.kv_blocks = None, 0

    def hold_kv(self, slot: _Slot, num_tokens: int) -> None:
        """Reserves KV blocks for num_tokens (prompt + max_new_tokens) at slot."""
        self.drop_kv()
        blocks = slot.blocks_for(num_tokens)
        self.kv_slot, self.kv_blocks = slot, blocks
        slot.reserved_kv_blocks += blocks
        slot.num_requests += 1
        slot.sequences += 1


class Router:
    def __init__(self, policy: RoutingPolicy = RoutingPolicy()) -> None:
        self.policy = policy
        self.snapshot_s = 0.0
        self._slots: dict[str, _Slot] = {}
        self._requests: dict[str, _Request] = {}
        self._routable: dict[str, list[_Slot]] = {role: [] for role in ROLES}
        self._bucket_max_tokens = [max_tokens for max_tokens, _ in policy.prefill_buckets]
        self._bucket_groups: list[list[_Slot]] = []     # per bucket: its instances and the unbucketed ones
        self._open_group: list[_Slot] = []             # unbucketed prefill instances (serve every length)
        self._capacity_floor = {role: NO_LIMIT for role in ROLES}   # the smallest routable instance, per role
        self._round_robin = {role: 0 for role in ROLES}
        self._num_picks = 0

    def set_policy(self, policy: RoutingPolicy) -> None:
        """A new policy (the controller's in-place config change); what this router tracks is kept."""
        self.policy = policy
        self._bucket_max_tokens = [max_tokens for max_tokens, _ in policy.prefill_buckets]
        self._rebuild()

    # -- snapshot and states -----------------------------------------------------------------------
    def update(self, views: Iterable[InstanceView], now_s: float) -> None:
        """Replaces the snapshot. Instances missing from it are forgotten, with their overrides."""
        slots: dict[str, _Slot] = {}
        for view in views:
            if view.name in slots:
                raise ValueError(f"instance {view.name!r} appears twice in one update")
            slot = self._slots.get(view.name)
            if slot is None:
                slot = _Slot(view)
            else:
                slot.set_view(view)
                if slot.override in ("unhealthy", "starting") and now_s > slot.override_s:
                    slot.override = None
            slots[view.name] = slot
        self._slots = slots
        self.snapshot_s = now_s
        self._rebuild()

    def set_state(self, name: str, state: str) -> None:
        """draining: sticky until set_state(name, "ready") or the instance leaves the snapshot;
        unhealthy/starting: until the next update(); ready: clears the override (the snapshot's state
        applies). An instance not in the snapshot is ignored (it may have just gone)."""
        if state not in STATES:
            raise ValueError(f"unknown state {state!r}; expected one of {', '.join(STATES)}")
        slot = self._slots.get(name)
        if slot is None:
            return
        slot.override = None if state == "ready" else state
        slot.override_s = self.snapshot_s
        self._rebuild()

    def instances(self) -> list[InstanceView]:
        """The current snapshot, each view with its effective state (overrides applied), by name."""
        slots = sorted(self._slots.values(), key=lambda s: s.order_key)
        return [s.view if s.state == s.view.state else replace(s.view, state=s.state) for s in slots]

    def router_load(self, name: str) -> RouterLoad:
        """What this router sent to `name` and has not been told is done (zeros for an unknown name)."""
        slot = self._slots.get(name)
        if slot is None:
            return RouterLoad(0, 0, 0)
        return RouterLoad(slot.pending_prompt_tokens, slot.reserved_kv_blocks, slot.num_requests)

    @property
    def num_tracked_requests(self) -> int:
        """Requests routed and not yet released."""
        return len(self._requests)

    def _rebuild(self) -> None:
        for role in ROLES:
            self._routable[role] = sorted((s for s in self._slots.values() if s.view.role == role
                                           and s.state == "ready"), key=lambda s: s.order_key)
            self._capacity_floor[role] = min((s.capacity_tokens for s in self._routable[role]), default=NO_LIMIT)
        prefill = self._routable["prefill"]
        bucketed = {name for _, names in self.policy.prefill_buckets for name in names}
        self._open_group = [s for s in prefill if s.name not in bucketed]
        self._bucket_groups = [[s for s in prefill if s.name in names or s.name not in bucketed]
                               for _, names in self.policy.prefill_buckets]

    def _mark(self, name: str, state: str, now_s: float) -> None:
        slot = self._slots.get(name)
        if slot is not None and slot.override != "draining":
            slot.override, slot.override_s = state, now_s
            self._rebuild()

    # -- picks -------------------------------------------------------------------------------------
    def pick_prefill(self, request_id: str, num_prompt_tokens: int, now_s: float,
                     exclude: frozenset[str] = frozenset()) -> Route | None:
        """Least queued prompt tokens (snapshot + sent by this router, not yet prefill_done) within the
        prompt's bucket group; skips instances not ready, excluded, or too small for the prompt."""
        request = self._request(request_id, num_prompt_tokens)
        exclude = exclude | request.excluded if request.excluded else exclude
        slot = None
        for group in self._prefill_groups(num_prompt_tokens):
            slot = self._choose_prefill(group, "prefill", num_prompt_tokens, exclude)
            if slot is not None:
                break
        if slot is None:
            self._forget_if_idle(request_id, request)
            return None
        self._note_pick(slot)
        request.hold_prefill(slot, num_prompt_tokens)
        request.prefill_attempts += 1
        request.kv_domain = slot.view.kv_domain
        return Route(request_id, slot.name, request.prefill_attempts)

    def pick_decode(self, request_id: str, num_prompt_tokens: int, max_new_tokens: int, now_s: float,
                    exclude: frozenset[str] = frozenset()) -> Route | None:
        """Most free KV blocks after this router's reservations (tie: fewer active sequences, then name),
        or with decode_load="sequences" the fewest sequences; skips instances that cannot hold
        prompt + max_new_tokens at all, and those outside the KV domain of the prefill instance picked last."""
        request = self._request(request_id, num_prompt_tokens)
        exclude = exclude | request.excluded if request.excluded else exclude
        num_tokens = num_prompt_tokens + max_new_tokens
        group = self._routable["decode"]
        if request.kv_domain:
            group = [s for s in group if s.view.kv_domain == request.kv_domain]
        slot = self._choose_decode(group, num_tokens, exclude)
        if slot is None:
            self._forget_if_idle(request_id, request)
            return None
        self._note_pick(slot)
        request.max_new_tokens = max_new_tokens
        request.hold_kv(slot, num_tokens)
        request.decode_attempts += 1
        return Route(request_id, slot.name, request.decode_attempts)

    def pick_colocated(self, request_id: str, num_prompt_tokens: int, max_new_tokens: int, now_s: float,
                       exclude: frozenset[str] = frozenset()) -> Route | None:
        """Least queued prompt tokens (an instance busy prefilling delays the first token most), tie by
        the decode rank (most free KV after reservations, then fewer sequences), then name; skips instances
        that cannot hold prompt + max_new_tokens. Holds the prompt tokens until prefill_done and the KV
        blocks until release."""
        request = self._request(request_id, num_prompt_tokens)
        exclude = exclude | request.excluded if request.excluded else exclude
        num_tokens = num_prompt_tokens + max_new_tokens
        slot = self._choose_prefill(self._routable["colocated"], "colocated", num_tokens, exclude)
        if slot is None:
            self._forget_if_idle(request_id, request)
            return None
        request.max_new_tokens = max_new_tokens
        request.hold_prefill(slot, num_prompt_tokens)
        self._note_pick(slot)
        request.hold_kv(slot, num_tokens)
        request.prefill_attempts += 1
        return Route(request_id, slot.name, request.prefill_attempts)

    def _request(self, request_id: str, num_prompt_tokens: int) -> _Request:
        request = self._requests.get(request_id)
        if request is None:
            request = self._requests[request_id] = _Request(num_prompt_tokens)
        return request

    def _forget_if_idle(self, request_id: str, request: _Request) -> None:
        """A request that was never placed leaves no record (the caller need not release it)."""
        if request.prefill_attempts == 0 and request.decode_attempts == 0 and not request.excluded:
            del self._requests[request_id]

    def _prefill_groups(self, num_prompt_tokens: int) -> list[list[_Slot]]:
        i = bisect_left(self._bucket_max_tokens, num_prompt_tokens) if self._bucket_max_tokens else 0
        if i == len(self._bucket_groups):
            return [self._open_group]
        if self.policy.spill_to_longer_buckets:
            return self._bucket_groups[i:] + [self._open_group]
        return [self._bucket_groups[i]]

    def _choose_prefill(self, group: list[_Slot], role: str, num_tokens: int,
                        exclude: frozenset[str]) -> _Slot | None:
        """Least queued prompt tokens; tie: name (the group is in name order and min keeps the first).
        Colocated instances also decode what they admit: among equal queues, most free KV blocks after
        reservations, then fewer active sequences (_decode_rank). Without that, an in-flight batching
        instance, whose prompts leave the queue within a step, would win every tie by its name and take the
        whole load while its peers idle."""
        if self.policy.balance == "round_robin":
            return self._next_round_robin(group, num_tokens, exclude)
        if exclude or num_tokens > self._capacity_floor[role]:
            group = _fitting(group, num_tokens, exclude)
        if not group:
            return None
        if role == "colocated":
            least = min(group, key=_QUEUED_TOKENS)
            tied = [s for s in group if s.queued_tokens == least.queued_tokens]
            if self.policy.tie_break == "least_recent":
                return min(tied, key=lambda s: (_decode_rank(s), s.last_pick))
            return least if len(tied) == 1 else min(tied, key=_decode_rank)
        if self.policy.tie_break == "least_recent":
            return min(group, key=lambda s: (s.queued_tokens, s.last_pick))
        return min(group, key=_QUEUED_TOKENS)

    def _choose_decode(self, group: list[_Slot], num_tokens: int, exclude: frozenset[str]) -> _Slot | None:
        """Most free KV blocks after reservations, tie: fewer active sequences, then name; or the fewest
        sequences (decode_load="sequences")."""
        if self.policy.balance == "round_robin":
            return self._next_round_robin(group, num_tokens, exclude)
        if exclude or num_tokens > self._capacity_floor["decode"]:
            group = _fitting(group, num_tokens, exclude)
        if not group:
            return None
        rank = _SEQUENCES if self.policy.decode_load == "sequences" else _decode_rank
        if self.policy.tie_break == "least_recent":
            return min(group, key=lambda s: (rank(s), s.last_pick))
        return min(group, key=rank)

    def _next_round_robin(self, group: list[_Slot], num_tokens: int, exclude: frozenset[str]) -> _Slot | None:
        """The role's next instance in name order, among those that can take the request."""
        fits = _fitting(group, num_tokens, exclude)
        if not fits:
            return None
        role = fits[0].view.role
        turn = self._round_robin[role]
        self._round_robin[role] = turn + 1
        return fits[turn % len(fits)]

    def _note_pick(self, slot: _Slot) -> None:
        self._num_picks += 1
        slot.last_pick = self._num_picks

    # -- bookkeeping -------------------------------------------------------------------------------
    def decode_started(self, request_id: str) -> None:
        """The decode instance admitted the request (its first token came): the instance's own metrics now
        count its KV blocks and sequence, so this router's reservation for it is dropped (else it would be
        counted twice until release)."""
        request = self._requests.get(request_id)
        if request is not None:
            request.drop_kv()

    def prefill_done(self, request_id: str) -> None:
        """The prefill (or colocated) instance answered: the request's prompt tokens leave its queue."""
        request = self._requests.get(request_id)
        if request is not None:
            request.drop_prefill()

    def release(self, request_id: str) -> None:
        """The request finished or failed: everything it held is dropped (a second call does nothing)."""
        request = self._requests.pop(request_id, None)
        if request is not None:
            request.drop_prefill()
            request.drop_kv()

    # -- failures ----------------------------------------------------------------------------------
    def on_failure(self, request_id: str, stage: str, error_kind: str, attempt: int, failed_instance: str,
                   now_s: float) -> FailureDecision:
        """stage "prefill": the prefill instance failed; "kv_pull": decode could not pull the KV because
        the prefill instance died (failed_instance is that prefill instance); "decode": the decode
        instance failed before the first token. `attempt` is the failed route's attempt. Retries are
        bounded by the policy, exclude every instance that failed this request, and become "fail" when no
        other instance is available; invalid_arg is never retried. An instance gone ("unavailable") is
        marked unhealthy until an update() later than now_s says otherwise. The failed stage's
        accounting is dropped (a colocated request's both holds); on "fail" the caller still calls
        release(). A colocated request's retry_prefill / retry_decode both mean pick_colocated again."""
        check_failure(stage, error_kind)
        request = self._requests.get(request_id)
        max_attempts = self.policy.max_decode_attempts if stage == "decode" else self.policy.max_prefill_attempts
        excluded = request.excluded if request is not None else frozenset()
        decision = decide_failure(stage, error_kind, attempt, max_attempts, failed_instance, excluded)
        if error_kind == "unavailable":
            self._mark(failed_instance, "unhealthy", now_s)
        if request is None:
            return decision
        request.excluded = decision.exclude
        colocated = any(slot is not None and slot.view.role == "colocated"
                        for slot in (request.prefill_slot, request.kv_slot))
        if stage != "decode" or colocated:
            request.drop_prefill()
        if stage == "decode" or colocated:
            request.drop_kv()
        if decision.action != "fail" and not self._has_alternative(request, stage, colocated, decision.exclude):
            return no_alternative(decision, stage, error_kind, failed_instance)
        return decision

    def _has_alternative(self, request: _Request, stage: str, colocated: bool, exclude: frozenset[str]) -> bool:
        with_output = request.num_prompt_tokens + request.max_new_tokens
        if colocated:
            return _any_fits(self._routable["colocated"], with_output, exclude)
        if stage == "decode":
            return _any_fits(self._routable["decode"], with_output, exclude)
        return any(_any_fits(group, request.num_prompt_tokens, exclude)
                   for group in self._prefill_groups(request.num_prompt_tokens))


def _any_fits(group: list[_Slot], num_tokens: int, exclude: frozenset[str]) -> bool:
    return any(s.capacity_tokens >= num_tokens and s.name not in exclude for s in group)


def _fitting(group: list[_Slot], num_tokens: int, exclude: frozenset[str]) -> list[_Slot]:
    return [s for s in group if s.capacity_tokens >= num_tokens and s.name not in exclude]


_QUEUED_TOKENS = attrgetter("queued_tokens")
_SEQUENCES = attrgetter("sequences")


def _decode_rank(slot: _Slot) -> tuple[int, int]:
    """Most free blocks after this router's reservations first, then fewer active sequences."""
    view = slot.view
    return slot.reserved_kv_blocks - view.free_kv_blocks, view.active + slot.num_requests
