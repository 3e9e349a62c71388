"""The controller's passes against a fake executor and a fake clock: bring-up, scale, heal, rollout
(promoted and rolled back), and the autoscaler acting and only observing. The store is the real SQLite one."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtpd.controller.controller import Controller, converged
from trtpd.controller.spec import load_spec
from trtpd.controller.store import ControllerStore
from trtpd.controller.types import ObservedInstance
from trtpd.schema.request_sample import RequestSample


class FakeExecutor:
    """Instances start in one pass and are ready the next; tests kill them or give them holds."""

    def __init__(self) -> None:
        self.instances: dict[str, dict] = {}
        self.calls: list[tuple] = []
        self.traffic = None
        self.settings: dict = {}

    def observe(self):
        out = [ObservedInstance(n, i["role"], i["revision"], i["alive"], i["alive"] and i["age"] > 0, i["holds"])
               for n, i in self.instances.items()]
        for i in self.instances.values():
            i["age"] += 1
        return out

    def start(self, name, role, revision, shape):
        self.calls.append(("start", name, revision))
        self.instances[name] = {"role": role, "revision": revision, "alive": True, "age": 0, "holds": 0,
                                "shape": shape}
        return {"pid": 1000 + len(self.calls)}

    def drain(self, name):
        self.calls.append(("drain", name))

    def stop(self, name, force=False, reason=""):
        self.calls.append(("stop", name, force))
        self.instances.pop(name, None)

    def set_traffic(self, split):
        self.traffic = split

    def apply_in_place(self, settings):
        self.settings = settings

    def relabel(self, names, revision):
        for n in names:
            self.instances[n]["revision"] = revision

    def wait_stopped(self):
        self.calls.append(("wait_stopped",))


def spec_file(tmp_path: Path, root: Path, name: str = "c", decode: str = "{instances: 1}", extra: str = "") -> Path:
    path = tmp_path / f"{name}-{abs(hash((decode, extra)))}.yaml"
    path.write_text(f"name: {name}\nmodel: tiny-llama\nengines: {{build_root: {root}}}\n"
                    f"roles:\n  prefill: {{instances: 1}}\n  decode: {decode}\n"
                    f"rollout: {{canary_share: 0.5, bake_s: 10, min_requests: 3, drain_timeout_s: 30}}\n{extra}")
    return path


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def rig(tmp_path, fp16_root):
    store = ControllerStore(tmp_path / "state" / "controller.db")
    clock, ex = Clock(), FakeExecutor()
    samples: list[RequestSample] = []

    def apply(path: Path) -> int:
        spec = load_spec(path)
        n = store.add_revision(spec.to_yaml(), spec.spec_json(), str(path), "test")
        if not store.get("stable_revision"):
            store.set_revision_status(n, "promoted")
            store.put_many({"stable_revision": n, "counts": spec.counts()})
        return n

    def controller(**kw) -> Controller:
        return Controller(store, ex, clock=clock, samples=lambda since: [s for s in samples if s.t >= since], **kw)

    return store, clock, ex, samples, apply, controller


def run(controller, clock, passes: int, step_s: float = 0.5):
    for _ in range(passes):
        clock.now += step_s
        controller.tick()


def test_bring_up_scale_and_heal(rig, tmp_path, fp16_root):
    store, clock, ex, _, apply, make = rig
    apply(spec_file(tmp_path, fp16_root))
    c = make()
    run(c, clock, 3)
    assert converged(store) and sorted(ex.instances) == ["decode-0", "prefill-0"]
    store.submit("scale", {"counts": {"decode": 2}}, "test")
    run(c, clock, 3)
    assert converged(store) and sorted(ex.instances) == ["decode-0", "decode-1", "prefill-0"]
    store.submit("scale", {"counts": {"decode": 1}}, "test")
    ex.instances["decode-0"]["holds"] = 5            # busy: decode-1 (idle, newest) is the one drained
    run(c, clock, 1)
    assert ("drain", "decode-1") in ex.calls and "decode-1" in ex.instances
    run(c, clock, 4)                                 # quiet for 1 s: retired
    assert ("stop", "decode-1", False) in ex.calls and sorted(ex.instances) == ["decode-0", "prefill-0"]
    ex.instances["prefill-0"]["alive"] = False       # SIGKILL
    run(c, clock, 2)
    assert ("stop", "prefill-0", True) in ex.calls and "prefill-1" in ex.instances
    assert [e.action for e in store.audit_log() if e.action in ("failed", "drained")] == ["drained", "failed"]


def test_scale_refusals_name_the_problem(rig, tmp_path, fp16_root):
    store, clock, ex, _, apply, make = rig
    apply(spec_file(tmp_path, fp16_root))
    c = make()
    bad = store.submit("scale", {"counts": {"colocated": 2}}, "test")
    zero = store.submit("scale", {"counts": {"decode": 0}}, "test")
    run(c, clock, 1)
    assert "not in this disaggregated deployment" in store.command(bad).result["error"]
    assert "at least 1" in store.command(zero).result["error"]
    assert store.get("counts") == {"prefill": 1, "decode": 1}


def sample(t, revision, ttft=0.1, tpot=0.02):
    return RequestSample(t=t, revision=revision, ok=True, error_kind=None, ttft_s=ttft, tpot_s=tpot, num_tokens=16,
                         num_prompt_tokens=40, prefill_queue_s=0.01, decode_queue_s=0.0)


@pytest.mark.parametrize("canary_tpot, outcome", [(0.02, "promoted"), (0.5, "rolled_back")])
def test_rollout_promotes_or_rolls_back_on_the_gate(rig, tmp_path, fp16_root, canary_tpot, outcome):
    store, clock, ex, samples, apply, make = rig
    apply(spec_file(tmp_path, fp16_root))
    c = make()
    run(c, clock, 3)
    new = apply(spec_file(tmp_path, fp16_root, decode="{instances: 1, max_batch_size: 32}"))
    store.submit("rollout", {"revision": new}, "test")
    run(c, clock, 4)      # started, observed starting, ready, then the rollout core sees it ready
    rollout = store.get("rollout")
    assert rollout["phase"] == "baking" and ex.traffic.canary_share == 0.5
    canary = next(n for n, i in ex.instances.items() if i["revision"] == new)
    assert ex.traffic.canary_instances == (canary,) and ex.instances[canary]["shape"].max_batch_size == 32
    for k in range(6):
        samples += [sample(clock.now + k, new, tpot=canary_tpot), sample(clock.now + k, 1)]
    run(c, clock, 36)     # bake_s 10 s, then promotion (or roll back) and the drains
    assert store.revision(new).status == outcome
    assert store.get("rollout")["phase"] == ("done" if outcome == "promoted" else "rolled_back")
    revisions = {i["role"]: i["revision"] for i in ex.instances.values()}
    assert revisions == ({"prefill": new, "decode": new} if outcome == "promoted" else {"prefill": 1, "decode": 1})
    assert store.get("stable_revision") == (new if outcome == "promoted" else 1)
    assert not ex.traffic.canary_revision   # no canary split left


def test_in_place_rollout_restarts_nothing(rig, tmp_path, fp16_root):
    store, clock, ex, _, apply, make = rig
    apply(spec_file(tmp_path, fp16_root))
    c = make()
    run(c, clock, 3)
    before = dict(ex.instances)
    new = apply(spec_file(tmp_path, fp16_root, extra="routing: {balance: round_robin}\n"))
    store.submit("rollout", {"revision": new}, "test")
    run(c, clock, 2)
    assert set(ex.instances) == set(before) and not [x for x in ex.calls if x[0] == "stop"]
    assert ex.settings["routing"]["balance"] == "round_robin" and store.get("stable_revision") == new


AUTOSCALE = ("autoscaling: {enabled: true, mode: MODE, interval_s: 1, cooldown_s: 0, min: {prefill: 1, decode: 1}, "
             "max: {prefill: 2, decode: 2}, budget_cpus: 4}\nslo: {ttft_s: 0.5, tpot_s: 0.1}\n")


@pytest.mark.parametrize("mode", ["act", "observe"])
def test_autoscaler_adds_prefill_when_ttft_misses_its_slo(rig, tmp_path, fp16_root, mode):
    store, clock, ex, samples, apply, make = rig
    apply(spec_file(tmp_path, fp16_root, extra=AUTOSCALE.replace("MODE", mode)))
    c = make(health=lambda: {"instances": [{"role": "prefill", "waiting": 4, "batch_utilisation": 1.0},
                                           {"role": "decode", "waiting": 0, "batch_utilisation": 0.1}]})
    run(c, clock, 3)
    samples += [sample(clock.now - k * 0.1, 1, ttft=2.0) for k in range(30)]   # TTFT P90 2 s > SLO 0.5 s
    run(c, clock, 3)
    if mode == "act":
        decision = next(e for e in store.audit_log() if e.action == "autoscale")
        assert decision.detail["changed"]["prefill"] == [1, 2] and "TTFT" in decision.detail["reasons"]["prefill"]
        assert store.get("counts")["prefill"] == 2 and "prefill-1" in ex.instances
    else:
        decision = next(e for e in store.audit_log() if e.action == "autoscale_observed")
        assert decision.detail["counts"]["prefill"] == 2 and decision.detail["mode"] == "observe"
        assert store.get("counts")["prefill"] == 1 and "prefill-1" not in ex.instances
        assert len([e for e in store.audit_log() if e.action == "autoscale_observed"]) == 1   # once per decision
