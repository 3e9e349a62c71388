"""The reconcile core: desired instances per (role, revision) + the instance table + what the executor
observes + the clock → the table's next rows and the actions that get there. Pure: no I/O, no clock read.

Rules, in order, for every instance in the table (see trtpd/controller/types.py for the lifecycle):
- starting: observed ready → ready; observed gone → failed; starting longer than start_timeout_s → failed.
- ready: observed gone → failed; observed alive but not ready for longer than unhealthy_grace_s → failed
  (a hung server: its health checks fail). A failed instance is stopped at once (force) and, since it no
  longer counts towards its (role, revision), a new one is started in the same pass: the replacement.
- draining: retires (stop) once it has held nothing for quiet_s in a row (the gateway's exact holds plus the
  instance's own metrics, which lag by up to a poll); at drain_timeout_s it is stopped anyway (force) and the
  reason names what it still held: a decode instance's streams end with an error; a prefill instance's
  unpulled KV is lost and the decode side's pull fails, which the routing core answers by prefilling again
  elsewhere (its max_prefill_attempts).
Then per (role, revision): fewer live (starting + ready) than wanted → start the difference; more → drain the
surplus (starting ones first, they serve nothing; then the ready ones holding least, newest first).
Instances of a (role, revision) no longer wanted at all are drained.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from trtpd.controller.types import Action, InstanceRow, ObservedInstance
LIVE = ("starting", "ready")


@dataclass(frozen=True)
class ReconcilePolicy:
    start_timeout_s: float = 180.0
    drain_timeout_s: float = 30.0
    quiet_s: float = 1.0             # a draining instance must hold nothing this long before it retires
    unhealthy_grace_s: float = 5.0   # a ready instance whose health checks fail this long is replaced


@dataclass(frozen=True)
class ReconcileResult:
    rows: list[InstanceRow]                       # the table's new rows (changed or new), to store
    actions: list[Action]                         # for the executor, in order
    events: list[dict] = field(default_factory=list)   # for the audit log: {"action", "instance", ...}


def reconcile(want: dict[tuple[str, int], int], table: list[InstanceRow], observed: list[ObservedInstance],
              now_s: float, next_index: dict[str, int], policy: ReconcilePolicy = ReconcilePolicy()) -> ReconcileResult:
    """`want`: instances wanted per (role, revision); `table`: the instance table (stopped rows are ignored);
    `observed`: what exists now; `next_index`: per role the next unused instance number (the caller stores
    the numbers used: a new instance's name is <role>-<n>)."""
    seen = {o.name: o for o in observed}
    rows: dict[str, InstanceRow] = {}
    actions: list[Action] = []
    events: list[dict] = []

    def move(row: InstanceRow, state: str, reason: str = "", **detail) -> InstanceRow:
        new = replace(row, state=state, since_s=now_s if state != row.state else row.since_s, reason=reason,
                      detail={**row.detail, **detail})
        rows[row.name] = new
        return new

    current: list[InstanceRow] = []
    for row in table:
        if row.state in ("stopped",):
            continue
        obs = seen.get(row.name)
        alive = obs is not None and obs.alive
        why = (obs.reason if obs is not None else "") or "its process is gone"
        if row.state == "failed":
            # stopped at once when it failed; a row still here means the stop did not finish: try again
            actions.append(Action("stop", instance=row.name, force=True, reason=row.reason))
            move(row, "stopped", row.reason)
            continue
        if row.state in LIVE and not alive:
            row = move(row, "failed", f"died: {why}")
        elif row.state == "starting" and obs.ready:
            row = move(row, "ready", "", unready_since_s=None)
            events.append({"action": "ready", "instance": row.name, "role": row.role, "revision": row.revision,
                           "start_s": round(now_s - table_row(table, row.name).since_s, 3)})
        elif row.state == "starting" and now_s - row.since_s > policy.start_timeout_s:
            row = move(row, "failed", f"not ready within start_timeout_s={policy.start_timeout_s:g}: {why}")
        elif row.state == "ready" and not obs.ready:
            since = row.detail.get("unready_since_s")
            if since is None:
                row = move(row, "ready", "", unready_since_s=now_s)
            elif now_s - since > policy.unhealthy_grace_s:
                row = move(row, "failed", f"health checks failing for {now_s - since:.1f} s: {why}")
        elif row.state == "ready" and row.detail.get("unready_since_s") is not None:
            row = move(row, "ready", "", unready_since_s=None)
        elif row.state == "draining":
            row = _drain_step(row, obs, alive, now_s, policy, move, actions, events)
        if row.state == "failed":
            actions.append(Action("stop", instance=row.name, force=True, reason=row.reason))
            events.append({"action": "failed", "instance": row.name, "role": row.role, "revision": row.revision,
                           "reason": row.reason})
            move(row, "stopped", row.reason)
            continue
        if row.state != "stopped":
            current.append(row)

    indices = dict(next_index)
    groups: dict[tuple[str, int], list[InstanceRow]] = {}
    for row in current:
        groups.setdefault((row.role, row.revision), []).append(row)
    for key in sorted(set(want) | set(groups)):
        role, revision = key
        live = [r for r in groups.get(key, []) if r.state in LIVE]
        wanted = want.get(key, 0)
        for _ in range(wanted - len(live)):
            n = indices.get(role, 0)
            indices[role] = n + 1
            name = f"{role}-{n}"
            rows[name] = InstanceRow(name, role, revision, "starting", now_s, "", {})
            actions.append(Action("start", instance=name, role=role, revision=revision,
                                  reason=f"{role} r{revision}: {len(live)} live, {wanted} wanted"))
        if len(live) > wanted:
            for row in _victims(live, seen)[:len(live) - wanted]:
                if row.state == "starting":     # serves nothing yet: stop it rather than drain it
                    actions.append(Action("stop", instance=row.name, force=True, reason="not wanted (starting)"))
                    move(row, "stopped", "not wanted")
                else:
                    actions.append(Action("drain", instance=row.name, reason=f"{role} r{revision}: "
                                                                             f"{len(live)} live, {wanted} wanted"))
                    move(row, "draining", "", holds_zero_since_s=None)
    return ReconcileResult(list(rows.values()), actions, events)


def table_row(table: list[InstanceRow], name: str) -> InstanceRow:
    return next(r for r in table if r.name == name)


def _drain_step(row, obs, alive, now_s, policy, move, actions, events) -> InstanceRow:
    if not alive:   # it went while draining: nothing left to wait for
        actions.append(Action("stop", instance=row.name, force=True, reason="gone while draining"))
        return move(row, "stopped", "gone while draining")
    holds = obs.holds
    if holds == 0:
        quiet = row.detail.get("holds_zero_since_s")
        if quiet is None:
            row = move(row, "draining", "", holds_zero_since_s=now_s)
        elif now_s - quiet >= policy.quiet_s:
            actions.append(Action("stop", instance=row.name, reason="drained"))
            events.append({"action": "drained", "instance": row.name, "role": row.role,
                           "revision": row.revision, "drain_s": round(now_s - row.since_s, 3)})
            return move(row, "stopped", "drained")
    elif row.detail.get("holds_zero_since_s") is not None:
        row = move(row, "draining", "", holds_zero_since_s=None)
    if now_s - row.since_s > policy.drain_timeout_s:
        what = "an unknown amount" if holds < 0 else f"{holds} request(s)/export(s)"
        reason = f"drain timeout ({policy.drain_timeout_s:g} s) with {what} still held; ended with an error"
        actions.append(Action("stop", instance=row.name, force=True, reason=reason))
        events.append({"action": "drain_timeout", "instance": row.name, "role": row.role,
                       "revision": row.revision, "holds": holds})
        return move(row, "stopped", reason)
    return row


def _victims(live: list[InstanceRow], seen: dict[str, ObservedInstance]) -> list[InstanceRow]:
    """Which to remove first: starting ones, then ready ones holding least, newest (highest number) first."""
    def key(row: InstanceRow):
        holds = seen[row.name].holds if row.name in seen else 0
        return (row.state != "starting", holds if holds >= 0 else 1 << 30, -_index(row.name))
    return sorted(live, key=key)


def _index(name: str) -> int:
    tail = name.rpartition("-")[2]
    return int(tail) if tail.isdigit() else 0


def next_indices(table: list[InstanceRow], known: dict[str, int]) -> dict[str, int]:
    """Per role one more than the highest instance number ever used (kept across restarts by the caller)."""
    out = dict(known)
    for row in table:
        out[row.role] = max(out.get(row.role, 0), _index(row.name) + 1)
    return out
