"""Canary traffic: which requests go to the canary revision, and which instances each request may use.

Pure (no clock, no I/O): the gateway calls it per request, the tests per sequence number. A request is a
canary request when floor((n+1)*share) > floor(n*share) for its sequence number n, so any window of
requests gets its share to within one request (no randomness to make a gate's sample uneven).

Roles that changed between the revisions ("changed_roles") use only instances of the request's own
revision: both changed roles together keep KV within one revision (a rollout that changes the KV layout of
prefill and decode at once never sends a new prefill's KV to an old decode). Unchanged roles serve both
cohorts; lint checked that the changed role's KV is compatible with theirs.

A request's cohort is read again whenever it finds no instance to take it: a split that moved while the
request was on its way (a promotion draining the last stable decode, a rollback draining the canary) hands
it to the other cohort, and a request whose KV sits on an instance the new cohort excludes is prefilled again.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Split:
    stable_revision: int = 0
    canary_revision: int = 0          # 0: no canary; every request is a stable one
    canary_share: float = 0.0         # in [0, 1]
    changed_roles: tuple[str, ...] = ()
    canary_instances: tuple[str, ...] = ()   # the canary revision's instances (of the changed roles)

    def __post_init__(self) -> None:
        if not 0.0 <= self.canary_share <= 1.0:
            raise ValueError(f"canary_share must be within [0, 1], got {self.canary_share}")

    @classmethod
    def from_dict(cls, d: dict | None) -> "Split":
        if not d:
            return cls()
        return cls(int(d.get("stable_revision", 0)), int(d.get("canary_revision", 0)),
                   float(d.get("canary_share", 0.0)), tuple(d.get("changed_roles", ())),
                   tuple(d.get("canary_instances", ())))

    @property
    def active(self) -> bool:
        return self.canary_revision > 0

    def revision_for(self, sequence: int) -> int:
        """The revision (cohort) request number `sequence` (0, 1, 2, ...) is served by."""
        if not self.active or self.canary_share <= 0.0:
            return self.stable_revision
        share = self.canary_share
        return self.canary_revision if math.floor((sequence + 1) * share) > math.floor(sequence * share) \
            else self.stable_revision

    def excluded(self, revision: int, instances: list[tuple[str, str]]) -> frozenset[str]:
        """Of (name, role) instances, those a request of cohort `revision` must not use: a stable request none
        of the canary's; a canary request no instance of a changed role that is not the canary's."""
        if not self.active:
            return frozenset()
        canary = set(self.canary_instances)
        if revision != self.canary_revision:
            return frozenset(canary)
        return frozenset(name for name, role in instances if role in self.changed_roles and name not in canary)


@dataclass
class Cohort:
    """One request's cohort: the revision serving it and the instances it must not use. `regroup` (the
    gateway's) gives both again from the traffic split as it is now, for a request of `revision`."""

    revision: int = 0
    exclude: frozenset[str] = frozenset()
    regroup: Callable[[int], tuple[int, frozenset[str]]] | None = None

    def refresh(self) -> None:
        if self.regroup is not None:
            self.revision, self.exclude = self.regroup(self.revision)
