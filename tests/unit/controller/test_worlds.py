"""backend tensorrt-llm: a revision is one Triton MPI world (trtpd/controller/spec.py `worlds`). What loading such a
spec checks, the world's shape, the controller turning `scale` into a new world rolled out beside the old one (canary,
gate, the old world drained before it stops), the blue/green GPU check, and the local executor starting a GPU world
from a finished build (rendered for real; the script stops at its tritonserver guard, as there is none here)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.unit.controller.test_controller import Clock, FakeExecutor, run, sample  # noqa: F401 (fixtures)
from tests.unit.controller.test_k8s_spec import finished_engines
from trtpd.controller.controller import Controller, converged
from trtpd.controller.local import LocalExecutor
from trtpd.controller.spec import changed_roles, diff_specs, load_spec
from trtpd.controller.store import ControllerStore
from trtpd.controller.types import WORLD
from trtpd.errors import ConfigError
from trtpd.fleet.gpus import GpuShortage
from trtpd.fleet.records import FleetRecord, load_fleet
from trtpd.trtllm.deploy import plan_deploy, write_deploy

SPEC = """\
name: w
model: tiny-llama
backend: tensorrt-llm
engines: {{build_root: {root}}}
roles:
  prefill: {{instances: 1}}
  decode: {{instances: 1}}
rollout: {{canary_share: 0.5, bake_s: 10, min_requests: 3, drain_timeout_s: 30}}
"""


def world_spec(tmp_path: Path, root: Path, *edits: tuple[str, str], name: str = "w.yaml"):
    text = SPEC.format(root=root)
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / name
    path.write_text(text)
    return load_spec(path)


def test_a_world_spec_is_one_unit_whose_shape_holds_both_roles_and_their_counts(tmp_path, fp16_root):
    spec = world_spec(tmp_path, fp16_root)
    assert (spec.worlds, spec.kv_transport, spec.unit_counts(), spec.counts()) == \
        (True, "mpi", {WORLD: 1}, {"prefill": 1, "decode": 1})
    world = spec.unit_shapes()[WORLD]
    roles = spec.role_shapes()
    assert world.world_roles == ((roles["prefill"], 1), (roles["decode"], 1))
    assert (world.gpus_per_instance, world.cpus_per_instance, world.gpu_ids) == (0, 2, ())   # the CPU stand-in
    bigger = world_spec(tmp_path, fp16_root, ("prefill: {instances: 1}", "prefill: {instances: 2}"), name="b.yaml")
    assert bigger.unit_shapes()[WORLD].config_hash != world.config_hash
    assert changed_roles(spec, bigger) == (WORLD,)            # new counts: a new world, not one more instance
    changes = diff_specs(spec, bigger)
    assert [(c.field, c.effect) for c in changes if c.effect != "in_place"] == [("roles.prefill.instances",
                                                                                "restart:world")]
    slower = world_spec(tmp_path, fp16_root, ("decode: {instances: 1}", "decode: {instances: 1, max_batch_size: 8}"),
                        name="s.yaml")
    assert changed_roles(spec, slower) == (WORLD,)
    assert changed_roles(spec, world_spec(tmp_path, fp16_root, ("bake_s: 10", "bake_s: 5"), name="r.yaml")) == ()


@pytest.mark.parametrize("edit, message", [
    (("name: w\n", "name: w\nmode: colocated\n"), "mode: colocated: a Triton MPI world (backend tensorrt-llm) holds "
                                                  "context and generation instances"),
    (("rollout:", "autoscaling: {enabled: true}\nrollout:"), "autoscaling.enabled: the autoscaler changes instance "
                                                             "counts in place; on backend tensorrt-llm new counts are "
                                                             "a new world"),
    (("rollout:", "kv_transport: ucx\nrollout:"), "kv_transport: 'ucx' is not a tensorrt-llm KV transport; use one "
                                                  "of mpi (Triton's tensorrtllm backend hard-codes"),
])
def test_what_a_world_cannot_do_is_refused_by_field(tmp_path, fp16_root, edit, message):
    if "colocated" in edit[1]:
        edit = ("roles:\n  prefill: {instances: 1}\n  decode: {instances: 1}\n", "roles:\n  colocated: {instances: 1}\n")
    text = SPEC.format(root=fp16_root).replace(*edit)
    if "mode: colocated" not in text and "colocated" in edit[1]:
        text = text.replace("name: w\n", "name: w\nmode: colocated\n")
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_spec(path)
    assert message in str(exc.value), str(exc.value)


@pytest.fixture
def rig(tmp_path):
    store = ControllerStore(tmp_path / "state" / "controller.db")
    clock, ex, samples = Clock(), FakeExecutor(), []

    def apply(spec) -> int:
        n = store.add_revision(spec.to_yaml(), spec.spec_json(), "test", "test")
        store.set_revision_status(n, "promoted")
        store.put_many({"stable_revision": n, "counts": spec.unit_counts()})
        return n

    controller = Controller(store, ex, clock=clock, samples=lambda since: [s for s in samples if s.t >= since])
    return store, clock, ex, samples, apply, controller


def test_scaling_a_world_rolls_out_a_new_world_and_drains_the_old_one_before_stopping_it(rig, tmp_path, fp16_root):
    store, clock, ex, samples, apply, c = rig
    apply(world_spec(tmp_path, fp16_root))
    run(c, clock, 3)
    assert converged(store) and list(ex.instances) == ["world-0"]
    command = store.submit("scale", {"counts": {"prefill": 2}}, "test")
    run(c, clock, 4)
    result = store.command(command).result
    assert result == {"from": {"prefill": 1, "decode": 1}, "to": {"prefill": 2, "decode": 1}, "world": True,
                      "revision": 2}
    assert store.get("counts") == {WORLD: 1}                    # still one world wanted per revision
    assert store.get("rollout")["phase"] == "baking" and sorted(ex.instances) == ["world-0", "world-1"]
    assert {m.role: n for m, n in ex.instances["world-1"]["shape"].world_roles} == {"prefill": 2, "decode": 1}
    assert (ex.traffic.changed_roles, ex.traffic.canary_instances, ex.traffic.canary_share) == \
        ((WORLD,), ("world-1",), 0.5)
    for k in range(6):
        samples += [sample(clock.now + k, 2), sample(clock.now + k, 1)]
    ex.instances["world-0"]["holds"] = 3                       # streams still running on the old world
    run(c, clock, 30)
    # promoted: every new request goes to the new world; the old one drains, and the rollout waits for it
    assert store.get("rollout")["phase"] == "promoting" and ("drain", "world-0") in ex.calls
    assert ex.traffic.canary_share == 1.0
    assert "world-0" in ex.instances and not any(call[:2] == ("stop", "world-0") for call in ex.calls)
    ex.instances["world-0"]["holds"] = 0                       # its last stream ended
    run(c, clock, 4)
    assert ("stop", "world-0", False) in ex.calls and list(ex.instances) == ["world-1"]
    run(c, clock, 1)
    assert store.get("rollout")["phase"] == "done" and store.get("stable_revision") == 2 and converged(store)
    assert store.revision(2).spec_json["roles"]["prefill"]["instances"] == 2
    assert [e.action for e in store.audit_log() if e.action in ("scale", "rollout_started", "drained")] == \
        ["scale", "rollout_started", "drained"]


def test_a_world_that_fails_the_gate_is_drained_and_the_running_world_kept(rig, tmp_path, fp16_root):
    store, clock, ex, samples, apply, c = rig
    apply(world_spec(tmp_path, fp16_root))
    run(c, clock, 3)
    slow = world_spec(tmp_path, fp16_root, ("decode: {instances: 1}", "decode: {instances: 1, step_delay_ms: 150}"),
                      name="slow.yaml")
    revision = store.add_revision(slow.to_yaml(), slow.spec_json(), "slow.yaml", "test")
    command = store.submit("rollout", {"revision": revision}, "test")
    run(c, clock, 4)
    assert store.command(command).result == {"in_place": False, "changed_roles": [WORLD]}
    assert ex.instances["world-1"]["shape"].step_delay_ms == 150
    for k in range(6):
        samples += [sample(clock.now + k, revision, tpot=0.5), sample(clock.now + k, 1)]
    run(c, clock, 30)
    assert store.get("rollout")["phase"] == "rolled_back" and store.revision(revision).status == "rolled_back"
    assert ("drain", "world-1") in ex.calls and list(ex.instances) == ["world-0"]
    assert store.get("stable_revision") == 1 and not ex.traffic.canary_revision


def test_scaling_a_world_to_its_own_counts_changes_nothing(rig, tmp_path, fp16_root):
    store, clock, ex, _, apply, c = rig
    apply(world_spec(tmp_path, fp16_root))
    run(c, clock, 3)
    command = store.submit("scale", {"counts": {"decode": 1}}, "test")
    run(c, clock, 2)
    assert store.command(command).result["world"] is False and store.get("rollout") is None
    assert len(store.revisions()) == 1


# -- on GPUs: blue/green needs room for both worlds ---------------------------------------------------------
@pytest.fixture(scope="module")
def deploy(tmp_path_factory) -> Path:
    """A finished llama-2-70b build (prefill TP2, decode TP4) and its deploy folder."""
    return write_deploy(plan_deploy(finished_engines(tmp_path_factory.mktemp("engines"))))


def gpu_world_spec(tmp_path: Path, deploy: Path, devices: int, name: str = "g.yaml"):
    root = deploy.parent
    path = tmp_path / name
    path.write_text(f"""name: g
model: llama-2-70b
backend: tensorrt-llm
engines: {{build_root: {root}}}
roles:
  prefill: {{instances: 1, tp: 2}}
  decode: {{instances: 1, tp: 4}}
gpus: {{devices: {list(range(devices))}}}
""")
    return load_spec(path)


def test_a_new_world_that_does_not_fit_beside_the_running_one_is_refused_with_the_counts(rig, tmp_path, deploy):
    store, clock, ex, _, apply, c = rig
    spec = gpu_world_spec(tmp_path, deploy, 8)
    assert spec.serve_dir() == deploy and spec.world_gpus(spec.counts()) == 6
    apply(spec)
    command = store.submit("scale", {"counts": {"prefill": 2}}, "test")
    run(c, clock, 1)
    assert store.command(command).result["error"] == (
        "scale to {'prefill': 2, 'decode': 1}: the new world (prefill 2x2 + decode 1x4: 8 GPUs) starts beside the "
        "running one (prefill 1x2 + decode 1x4: 6 GPUs) until that one drains: 14 GPUs needed, but gpus.devices has "
        "8 ([0, 1, 2, 3, 4, 5, 6, 7]); add devices, or change less at once (`trtpd down` then `trtpd up` restarts "
        "with no room needed, ending what is in flight)")
    assert len(store.revisions()) == 1 and store.get("rollout") is None


@pytest.fixture
def gpu_executor(tmp_path, deploy, monkeypatch):
    monkeypatch.setenv("TRTPD_HOME", str(tmp_path / "home"))
    FleetRecord("g", "disaggregated", str(deploy.parent), str(tmp_path / "key"), str(deploy / "tokenizer")).save()
    ex = LocalExecutor("g", "disaggregated", cpus=[0])
    yield ex, gpu_world_spec(tmp_path, deploy, 14).unit_shapes()[WORLD]
    for name in [i.name for i in ex.fleet().instances]:
        ex.stop(name, force=True)
    ex.wait_stopped()


def test_the_executor_renders_and_runs_a_gpu_world_from_the_build(gpu_executor, deploy):
    ex, shape = gpu_executor
    assert (shape.gpus_per_instance, shape.serve_dir) == (6, str(deploy))
    assert ex.start("world-0", WORLD, 1, shape)["gpus"] == [0, 1, 2, 3, 4, 5]
    fleet = load_fleet("g")
    inst = fleet.instance("world-0")
    script = (fleet.folder / "instances" / "world-0" / "world" / "launch_world.sh").read_text()
    assert "export CUDA_VISIBLE_DEVICES=0,1,2,3,4,5" in script
    assert f"--http-port={inst.server.ports.http}" in script and f"--grpc-port={inst.server.ports.grpc}" in script
    assert [(e.name, e.role, e.model, e.world) for e in fleet.fleet_file().routed] == [
        ("world-0.prefill", "prefill", "prefill", "world-0"), ("world-0.decode", "decode", "decode", "world-0")]
    # the script runs: here it stops at its guard (no tritonserver), which the GPU box's container passes
    deadline = time.monotonic() + 10
    while inst.server.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not inst.server.is_alive() and "is not in this image" in Path(inst.server.log_path).read_text()


def test_worlds_side_by_side_take_gpu_sets_of_their_own(gpu_executor, monkeypatch):
    """The world's process is stood in for by one that stays up (as a world serving would), so both hold GPUs."""
    import subprocess

    popen = subprocess.Popen
    monkeypatch.setattr("trtpd.fleet.gpu_world.subprocess.Popen",
                        lambda argv, **kw: popen(["sh", "-c", "exec sleep 60"], **kw))
    ex, shape = gpu_executor
    first, second = ex.start("world-0", WORLD, 1, shape), ex.start("world-1", WORLD, 2, shape)
    assert (first["gpus"], second["gpus"]) == ([0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11])
    with pytest.raises(GpuShortage, match=r"instance world-2 needs 6 GPU\(s\) but 2 of the inventory's 14"):
        ex.start("world-2", WORLD, 2, shape)
    script = (load_fleet("g").folder / "instances" / "world-1" / "world" / "launch_world.sh").read_text()
    assert "export CUDA_VISIBLE_DEVICES=6,7,8,9,10,11" in script
