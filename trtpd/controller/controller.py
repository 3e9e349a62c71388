"""The controller: one pass (`tick`) reads what the CLI asked (commands in the store), observes the
instances through the executor, runs the pure cores (rollout, reconcile) and carries out their actions
through the executor, writing every decision to the store's audit log. `run` repeats it until stopped; a
restarted controller resumes from the store (revisions, instance table, rollout state, counts).

Store keys: stable_revision (int), counts ({role: n} of the stable revision), rollout (Rollout or None),
next_index ({role: n}), traffic (TrafficSplit last set), controller ({pid, start_time, host}).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, replace

from trtpd.controller.reconcile import ReconcilePolicy, next_indices, reconcile
from trtpd.controller.rollout import TERMINAL, Rollout, RolloutPolicy, start_rollout, step
from trtpd.controller.spec import DeploymentSpec, changed_roles, diff_specs
from trtpd.controller.store import ControllerStore
from trtpd.controller.types import Action, Executor, InstanceRow, TrafficSplit
from trtpd.errors import TrtpdError
from trtpd.schema.request_sample import RequestSample

log = logging.getLogger(__name__)
ACTOR = "controller"
ACTIVE = ("starting", "ready", "draining", "failed")


class Controller:
    def __init__(self, store: ControllerStore, executor: Executor, *, clock: Callable[[], float] = time.time,
                 samples: Callable[[float], list[RequestSample]] | None = None, health: Callable[[], dict | None] | None = None,
                 autoscaler_for: Callable[[DeploymentSpec], object] | None = None) -> None:
        """samples(since_s): the gateway's finished requests since then; health(): its /health body;
        autoscaler_for(spec): the Autoscaler for a revision (default: the planner's models of its engines)."""
        self.store = store
        self.executor = executor
        self.clock = clock
        self.samples = samples or (lambda since_s: [])
        self.health = health or (lambda: None)
        self.autoscaler_for = autoscaler_for
        self._specs: dict[int, DeploymentSpec] = {}
        self._autoscaler: tuple[int, object] | None = None   # (revision, Autoscaler)
        self._autoscaled_s = float("-inf")
        self._observed: dict | None = None   # the last observe-mode decision recorded

    # ---- revisions ----------------------------------------------------------------------------
    def spec(self, revision: int) -> DeploymentSpec:
        if revision not in self._specs:
            self._specs[revision] = DeploymentSpec.from_json(self.store.revision(revision).spec_json)
        return self._specs[revision]

    @property
    def stable_revision(self) -> int:
        return int(self.store.get("stable_revision", 0))

    def policies(self, spec: DeploymentSpec) -> tuple[ReconcilePolicy, RolloutPolicy]:
        r = spec.rollout
        return (ReconcilePolicy(start_timeout_s=r.start_timeout_s, drain_timeout_s=r.drain_timeout_s),
                RolloutPolicy(canary_share=r.canary_share, bake_s=r.bake_s, min_requests=r.min_requests,
                              max_ttft_ratio=r.max_ttft_ratio, max_tpot_ratio=r.max_tpot_ratio,
                              max_error_rate=r.max_error_rate, slo=spec.slo))

    # ---- one pass -----------------------------------------------------------------------------
    def tick(self) -> list[Action]:
        now = self.clock()
        for command in self.store.pending():
            if self.store.claim(command.id):
                try:
                    result = self._command(command.kind, command.payload, command.actor, now)
                    self.store.finish(command.id, "done", result)
                except TrtpdError as exc:
                    self.store.finish(command.id, "failed", {"error": str(exc)})
                    self.store.audit(command.actor, f"{command.kind}_refused", self.stable_revision,
                                     {"error": str(exc), **command.payload})
        stable = self.stable_revision
        if not stable:
            return []
        spec = self.spec(stable)
        observed = self.executor.observe()
        table = self.store.instances(states=ACTIVE)
        rollout_d = self.store.get("rollout")
        rollout = Rollout.from_dict(rollout_d) if rollout_d else None
        reconcile_policy, rollout_policy = self.policies(spec if rollout is None else self.spec(rollout.revision))
        if rollout is not None and rollout.phase not in TERMINAL:
            since = rollout.phase_since_s
            samples = self.samples(since) if rollout.phase == "baking" else []
            result = step(rollout, table, [s for s in samples if s.revision == rollout.revision],
                          [s for s in samples if s.revision == rollout.stable_revision], now, rollout_policy)
            for event in result.events:
                self.store.audit(ACTOR, event.pop("action"), rollout.revision, event)
            self._set_traffic(result.traffic)
            rollout = result.rollout
            want = result.want
            if rollout.phase in TERMINAL:   # recorded before the state says so: a follower sees the whole story
                table = self._finish_rollout(rollout, table)
            self.store.put("rollout", rollout.to_dict())
        else:
            if spec.autoscaling.enabled and now - self._autoscaled_s >= spec.autoscaling.interval_s \
                    and converged(self.store):   # decide from a fleet at its counts, not one still starting
                self._autoscaled_s = now
                self._autoscale(spec, stable, table, now)
            want = {(role, stable): n for role, n in self.store.get("counts", spec.unit_counts()).items()}
        indices = next_indices(self.store.instances(), self.store.get("next_index", {}))
        result = reconcile(want, table, observed, now, indices, reconcile_policy)
        for row in result.rows:
            self.store.put_instance(row)
        self.store.put("next_index", next_indices(result.rows, indices))
        for event in result.events:
            self.store.audit(ACTOR, event.pop("action"), event.get("revision", stable), event)
        for action in result.actions:
            self._execute(action, now)
        return result.actions

    def _autoscale(self, spec: DeploymentSpec, stable: int, table: list[InstanceRow], now: float) -> None:
        """One autoscaler decision from the fleet's last window; applied (act) or recorded only (observe)."""
        from trtpd.autoscale.live import live_autoscaler, observe

        if self._autoscaler is None or self._autoscaler[0] != stable:
            self._autoscaler = (stable, (self.autoscaler_for or live_autoscaler)(spec))
        autoscaler = self._autoscaler[1]
        window = autoscaler.policy.window_s
        obs = observe(now, window, self.samples(now - window), self.health(), table, spec.slo)
        decision = autoscaler.decide(obs)
        if not decision.changed:
            return
        seen = {"rate_per_s": round(obs.arrival_rate_per_s, 3), "mean_input_tokens": round(obs.mean_input_tokens, 1),
                "mean_output_tokens": round(obs.mean_output_tokens, 1),
                "ttft_p_s": obs.roles["prefill"].ttft_p_s, "tpot_p_s": obs.roles["decode"].tpot_p_s,
                "waiting": {r: o.waiting_requests for r, o in obs.roles.items()}}
        detail = {"counts": decision.counts, "changed": {r: list(v) for r, v in decision.changed.items()},
                  "reasons": decision.reasons, "needed": {r: round(v, 3) for r, v in decision.needed.items()},
                  "observed": seen, "mode": autoscaler.policy.mode}
        if not decision.applied:   # observe mode: what it would do, once per distinct decision
            if self._observed != decision.counts:
                self._observed = decision.counts
                self.store.audit(ACTOR, "autoscale_observed", stable, detail)
            return
        counts = {**self.store.get("counts", spec.unit_counts()), **decision.counts}
        self.store.put("counts", counts)
        self.store.audit(ACTOR, "autoscale", stable, detail)

    def _execute(self, action: Action, now: float) -> None:
        try:
            if action.kind == "start":
                shape = self.spec(action.revision).unit_shapes()[action.role]
                detail = self.executor.start(action.instance, action.role, action.revision, shape)
                row = self.store.instance(action.instance)
                self.store.put_instance(replace(row, detail={**row.detail, **detail}))
            elif action.kind == "drain":
                self.executor.drain(action.instance)
            elif action.kind == "stop":
                self.executor.stop(action.instance, force=action.force, reason=action.reason)
            self.store.audit(ACTOR, action.kind, action.revision or self._revision_of(action.instance),
                             {"instance": action.instance, "role": action.role, "force": action.force,
                              "reason": action.reason})
        except Exception as exc:   # one failed side effect must not stop the pass; the next pass sees the result
            log.exception("%s %s failed", action.kind, action.instance)
            self.store.audit(ACTOR, f"{action.kind}_failed", action.revision, {"instance": action.instance,
                                                                              "error": f"{type(exc).__name__}: {exc}"})
            if action.kind == "start":
                row = self.store.instance(action.instance)
                self.store.put_instance(replace(row, state="failed", since_s=now,
                                                reason=f"start failed: {type(exc).__name__}: {exc}"))

    def _revision_of(self, name: str) -> int:
        row = self.store.instance(name)
        return row.revision if row is not None else 0

    def _set_traffic(self, split: TrafficSplit) -> None:
        if self.store.get("traffic") != asdict(split):
            self.executor.set_traffic(split)
            self.store.put("traffic", asdict(split))

    def _finish_rollout(self, rollout: Rollout, table: list[InstanceRow]) -> list[InstanceRow]:
        if rollout.phase == "done":
            kept = [r for r in table if r.role not in rollout.changed_roles and r.revision == rollout.stable_revision]
            for row in kept:   # the unchanged roles' instances run the new revision's config as they are
                self.store.put_instance(replace(row, revision=rollout.revision))
            if kept:
                self.executor.relabel([r.name for r in kept], rollout.revision)
            self.store.put_many({"stable_revision": rollout.revision, "counts": rollout.new_counts})
            self.store.set_revision_status(rollout.stable_revision, "superseded")
            self.store.set_revision_status(rollout.revision, "promoted")
            self._apply_in_place(self.spec(rollout.revision))
        else:
            self.store.set_revision_status(rollout.revision, "rolled_back")
        self.store.audit(ACTOR, "rollout_finished", rollout.revision,
                         {"phase": rollout.phase, "reason": rollout.reason, "gate": rollout.gate,
                          "duration_s": round(self.clock() - rollout.started_s, 3)})
        return self.store.instances(states=ACTIVE)

    def _apply_in_place(self, spec: DeploymentSpec) -> None:
        routing = asdict(spec.routing_policy())
        self.executor.apply_in_place({"routing": routing})

    # ---- commands (from the CLI, through the store) -------------------------------------------
    def _command(self, kind: str, payload: dict, actor: str, now: float) -> dict:
        rollout_d = self.store.get("rollout")
        busy = rollout_d is not None and rollout_d["phase"] not in TERMINAL
        if kind == "scale":
            if busy:
                raise TrtpdError(f"a rollout of revision {rollout_d['revision']} is in progress "
                                 f"({rollout_d['phase']}); scale after it ends")
            spec = self.spec(self.stable_revision)
            unknown = sorted(set(payload["counts"]) - set(spec.role_names))
            if unknown:
                raise TrtpdError(f"role(s) {', '.join(unknown)} not in this {spec.mode} deployment "
                                 f"(roles: {', '.join(spec.role_names)})")
            for role, n in payload["counts"].items():
                if n < 1:
                    raise TrtpdError(f"{role}={n}: at least 1 instance per role")
            if spec.worlds:
                return self._scale_world(spec, payload["counts"], actor, now)
            counts = dict(self.store.get("counts", spec.counts()))
            new = {**counts, **payload["counts"]}
            shortage = spec.gpu_shortage(new)
            if shortage:
                raise TrtpdError(f"scale to {new}: {shortage}")
            self.store.put("counts", new)
            self.store.audit(actor, "scale", self.stable_revision, {"from": counts, "to": new})
            return {"from": counts, "to": new}
        if kind == "rollout":
            if busy:
                raise TrtpdError(f"a rollout of revision {rollout_d['revision']} is in progress "
                                 f"({rollout_d['phase']}); `trtpd rollout --undo` or wait")
            revision, stable = int(payload["revision"]), self.stable_revision
            old, new = self.spec(stable), self.spec(revision)
            changes = diff_specs(old, new)
            roles = changed_roles(old, new)
            counts = self.store.get("counts", old.unit_counts())
            if not roles:   # no instance needs a restart: counts and settings applied where they run
                self._apply_in_place(new)
                self.store.put_many({"stable_revision": revision, "counts": new.unit_counts()})
                table = self.store.instances(states=ACTIVE)
                for row in table:
                    self.store.put_instance(replace(row, revision=revision))
                self.executor.relabel([r.name for r in table], revision)
                self.store.set_revision_status(stable, "superseded")
                self.store.set_revision_status(revision, "promoted")
                self.store.audit(actor, "apply_in_place", revision,
                                 {"changes": [asdict(c) for c in changes], "counts": new.unit_counts()})
                return {"in_place": True}
            shortage = new.blue_green_shortage(old) if new.worlds else None
            if shortage:
                raise TrtpdError(f"revision {revision}: {shortage}")
            self._begin_rollout(revision, roles, counts, new.unit_counts(), changes, actor, now)
            return {"in_place": False, "changed_roles": list(roles)}
        raise TrtpdError(f"unknown command {kind!r}")

    def _begin_rollout(self, revision: int, roles: tuple[str, ...], counts: dict, new_counts: dict, changes: list,
                       actor: str, now: float) -> None:
        stable = self.stable_revision
        r = start_rollout(revision, stable, roles, counts, new_counts, now)
        self.store.put("rollout", r.to_dict())
        self.store.set_revision_status(revision, "canary")
        self.store.audit(actor, "rollout_started", revision,
                         {"from_revision": stable, "changed_roles": list(roles),
                          "changes": [asdict(c) for c in changes]})

    def _scale_world(self, spec: DeploymentSpec, counts: dict[str, int], actor: str, now: float) -> dict:
        """New counts on backend tensorrt-llm: a revision that differs only in them, rolled out as a new world
        beside the running one (canary share, gate, then the old world drains and stops)."""
        old = spec.counts()
        new_counts = {**old, **counts}
        if new_counts == old:
            return {"from": old, "to": new_counts, "world": False}
        data = spec.spec_json()
        for role, n in counts.items():
            data["roles"][role]["instances"] = n
        new = DeploymentSpec.from_json(data)
        shortage = new.blue_green_shortage(spec)
        if shortage:
            raise TrtpdError(f"scale to {new_counts}: {shortage}")
        revision = self.store.add_revision(new.to_yaml(), new.spec_json(), f"trtpd scale {spec.name}", actor,
                                           f"trtpd scale: {old} -> {new_counts}, a new world")
        self.store.audit(actor, "scale", self.stable_revision, {"from": old, "to": new_counts, "revision": revision})
        self._begin_rollout(revision, changed_roles(spec, new), self.store.get("counts", spec.unit_counts()),
                            new.unit_counts(), diff_specs(spec, new), actor, now)
        return {"from": old, "to": new_counts, "world": True, "revision": revision}

    # ---- the loop -----------------------------------------------------------------------------
    def converged(self) -> bool:
        return converged(self.store)

    def run(self, interval_s: float = 0.5, should_stop: Callable[[], bool] = lambda: False) -> None:
        while not should_stop():
            started = time.monotonic()
            try:
                self.tick()
            except Exception:   # the loop survives a bad pass (logged); the store is consistent per write
                log.exception("controller pass failed")
            time.sleep(max(0.0, interval_s - (time.monotonic() - started)))


def converged(store: ControllerStore) -> bool:
    """Every wanted instance ready, nothing starting or draining, no rollout in progress."""
    rollout_d = store.get("rollout")
    if rollout_d is not None and rollout_d["phase"] not in TERMINAL:
        return False
    rows = store.instances(states=ACTIVE)
    if any(r.state != "ready" for r in rows):
        return False
    have: dict[str, int] = {}
    for r in rows:
        have[r.role] = have.get(r.role, 0) + 1
    return have == {k: v for k, v in store.get("counts", {}).items() if v}
