"""A spec with `backend: trtllm-serve` and a `gpus` section (trtpd/controller/spec.py GpusSpec): real workers from
`trtpd build`'s serve-pytorch/ on GPU sets of an inventory. Here: what loading such a spec checks, what a change
of it restarts, and how the local executor gives each instance a GPU set from what fleet.json and the instances
still stopping hold (the worker process itself is stood in for: no GPU is needed)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from trtpd.cli.main import main
from trtpd.controller.local import LocalExecutor
from trtpd.controller.spec import diff_specs, load_spec
from trtpd.errors import ConfigError
from trtpd.fleet.gpus import GpuShortage
from trtpd.fleet.records import FleetRecord, InstanceRecord
from trtpd.fleet.serve_workers import ServeStarter
from trtpd.fleet.tritonserver import ServerPorts, ServerProcess
from trtpd.process_identity import start_time

SPEC = """\
name: g
model: tiny-llama
backend: trtllm-serve
engines: {{build_root: {root}}}
roles:
  prefill: {{instances: 1, tp: 2}}
  decode: {{instances: 1, tp: 4}}
gpus:
  devices: [0, 1, 2, 3, 4, 5, 6, 7]
  serve_command: {command}
"""


@pytest.fixture(scope="module")
def gpu_root(fp16_root, tmp_path_factory) -> Path:
    """engines/tiny-llama of `trtpd build --configs-only` (prefill tp 2, decode tp 4): manifests and serve-pytorch/."""
    out = tmp_path_factory.mktemp("gpu-build")
    assert main(["build", "--model", "tiny-llama", "--configs-only", "--no-fp8", "--hf-model",
                 str(fp16_root / "checkpoint"), "--engines-dir", str(out), "--prefill-tp", "2",
                 "--decode-tp", "4"]) == 0
    return out / "tiny-llama"


def gpu_spec(tmp_path: Path, root: Path, *edits: tuple[str, str], name: str = "dep.yaml",
             command: str = "trtllm-serve"):
    text = SPEC.format(root=root, command=command)
    for old, new in edits:
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / name
    path.write_text(text)
    return load_spec(path)


def load_error(tmp_path: Path, root: Path, *edits: tuple[str, str]) -> str:
    with pytest.raises(ConfigError) as exc:
        gpu_spec(tmp_path, root, *edits, name="bad.yaml")
    return str(exc.value)


# -- the spec ----------------------------------------------------------------------------------------
def test_a_gpu_spec_allows_tp_and_carries_the_inventory_and_workers(tmp_path, gpu_root):
    s = gpu_spec(tmp_path, gpu_root)
    assert (s.gpus_per_instance("prefill"), s.gpus_per_instance("decode")) == (2, 4)
    assert s.serve_dir() == gpu_root / "deploy" / "serve-pytorch"       # beside the engines by default
    shape = s.role_shapes()["decode"]
    assert (shape.gpu_ids, shape.serve_dir, shape.serve_command, shape.gpus_per_instance) == \
        (tuple(range(8)), str(gpu_root / "deploy" / "serve-pytorch"), ("trtllm-serve",), 4)
    assert shape.engine_dir == str(gpu_root / "decode-tp4")            # a manifest, no config.json


def test_loading_refuses_by_field(tmp_path, gpu_root):
    message = load_error(tmp_path, gpu_root, ("  decode: {instances: 1, tp: 4}", "  decode: {instances: 2, tp: 4}"))
    assert "bad.yaml:9: gpus.devices: the initial instances do not fit: 10 GPUs needed (prefill 1x2 + decode 2x4) " \
           "but the inventory gpus.devices has 8" in message
    message = load_error(tmp_path, gpu_root, ("tp: 4}", "tp: 2}"))
    assert ":7: roles.decode.tp: 2 (gpus_per_instance 2), but" in message
    assert "launch.sh starts the decode worker with --tp_size 4 --pp_size 1" in message
    message = load_error(tmp_path, gpu_root, ("devices: [0, 1, 2, 3, 4, 5, 6, 7]", "devices: [0, 1, 1, 2, 3, 4, 5, 6]"))
    assert "gpus.devices: GPU inventory [0, 1, 1, 2, 3, 4, 5, 6]: a device id is listed twice" in message
    message = load_error(tmp_path, gpu_root, ("gpus:\n", "gpus:\n  serve_dir: nowhere\n"))
    assert f"gpus.serve_dir: {(tmp_path / 'nowhere').resolve()}: no launch.sh here" in message
    message = load_error(tmp_path, gpu_root, ("backend: trtllm-serve\n", ""))
    assert "gpus: real workers on this machine's GPUs are trtllm-serve's or Triton MPI worlds (backend reference)" \
        in message
    message = load_error(tmp_path, gpu_root, ("tp: 2}", "tp: 2, step_delay_ms: 5}"))
    assert "roles.prefill.step_delay_ms: the CPU twin's fault injection" in message
    message = load_error(tmp_path, gpu_root, ("gpus:\n", "autoscaling: {enabled: true, max: {decode: 2}}\n"
                                                         "gpus:\n"))
    assert "autoscaling.budget_gpus: the autoscaler may hold 10 GPUs, more than the 8 of gpus.devices" in message


def test_the_serve_folder_and_command_restart_every_role_the_inventory_applies_in_place(tmp_path, gpu_root):
    old = gpu_spec(tmp_path, gpu_root, name="old.yaml")
    wider = gpu_spec(tmp_path, gpu_root, ("5, 6, 7]", "5, 6, 7, 8]"), name="wider.yaml")
    assert {(c.field, c.effect) for c in diff_specs(old, wider)} == {("gpus.devices", "in_place")}
    assert wider.role_shapes()["decode"].config_hash == old.role_shapes()["decode"].config_hash
    other = gpu_spec(tmp_path, gpu_root, name="other.yaml", command="'trtllm-serve --log_level info'")
    assert {(c.field, c.effect) for c in diff_specs(old, other)} == {
        ("gpus.serve_command", "restart:prefill"), ("gpus.serve_command", "restart:decode")}
    assert other.role_shapes()["decode"].config_hash != old.role_shapes()["decode"].config_hash


# -- the local executor ------------------------------------------------------------------------------
@pytest.fixture
def executor(tmp_path, gpu_root, monkeypatch):
    """A LocalExecutor for the spec's fleet whose workers are a process that ignores SIGTERM (as a worker busy
    freeing its GPUs): a stop holds the GPUs until the process is gone."""
    monkeypatch.setenv("TRTPD_HOME", str(tmp_path / "home"))
    FleetRecord("g", "disaggregated", str(gpu_root), str(tmp_path / "key"), str(gpu_root)).save()
    started: dict[str, tuple] = {}

    def start(self, fleet, plan):
        assert self.gpus is not None and self.gpus.command == ("trtllm-serve",)   # the real worker's command
        proc = subprocess.Popen(["sh", "-c", "trap '' TERM; exec sleep 60"], start_new_session=True)
        server = ServerProcess(proc.pid, "127.0.0.1", plan.ports, str(tmp_path), str(tmp_path / "log"),
                               f"trtpdtest{proc.pid}_", start_time=start_time(proc.pid) or 0, ready_path="/health")
        server._popen = proc
        started[plan.name] = plan.gpus
        return InstanceRecord(plan.name, plan.role, "tiny-llama", server, "", "tcp", "", "", plan.cpus, 1, 0, 1, 2,
                              revision=plan.revision, protocol="trtllm-serve", gpus=list(plan.gpus))

    monkeypatch.setattr(ServeStarter, "start", start)
    ex = LocalExecutor("g", "disaggregated", cpus=[0])
    yield ex, started
    for inst in ex.fleet().instances:
        ex.stop(inst.name, force=True)
    ex.wait_stopped()


def test_each_start_takes_a_free_gpu_set_and_a_shortage_names_the_counts(tmp_path, gpu_root, executor):
    ex, started = executor
    shapes = gpu_spec(tmp_path, gpu_root, ("5, 6, 7]", "5]")).role_shapes()     # 6 GPUs
    assert ex.start("decode-0", "decode", 1, shapes["decode"])["gpus"] == [0, 1, 2, 3]
    ex.start("prefill-0", "prefill", 1, shapes["prefill"])
    assert started == {"decode-0": (0, 1, 2, 3), "prefill-0": (4, 5)}
    assert [i.gpus for i in ex.fleet().instances] == [[0, 1, 2, 3], [4, 5]]      # recorded in fleet.json
    with pytest.raises(GpuShortage, match=r"instance prefill-1 needs 2 GPU\(s\) but 0 of the inventory's 6 are "
                                          r"free .*held: decode-0 \[0, 1, 2, 3\], prefill-0 \[4, 5\]"):
        ex.start("prefill-1", "prefill", 1, shapes["prefill"])
    assert "prefill-1" not in started


def test_a_stopped_instances_gpus_are_free_once_its_process_is_gone(tmp_path, gpu_root, executor):
    ex, started = executor
    shapes = gpu_spec(tmp_path, gpu_root, ("5, 6, 7]", "5]")).role_shapes()
    ex.start("prefill-0", "prefill", 1, shapes["prefill"])
    ex.start("decode-0", "decode", 1, shapes["decode"])
    ex.stop("prefill-0", force=True)
    assert [i.name for i in ex.fleet().instances] == ["decode-0"]                # the gateway forgets it at once
    assert ex.gpu_inventory(ex.fleet(), (0, 1, 2, 3, 4, 5)).num_free == 0       # its process still runs
    ex.start("prefill-1", "prefill", 1, shapes["prefill"])     # healing on a full inventory: waits for the stop
    assert started["prefill-1"] == (0, 1)
    with pytest.raises(GpuShortage, match=r"held: decode-0 \[2, 3, 4, 5\], prefill-1 \[0, 1\]"):
        ex.start("prefill-2", "prefill", 1, shapes["prefill"])                  # nothing being stopped: no wait


# -- the controller ----------------------------------------------------------------------------------
class IdleExecutor:
    """Starts nothing that matters: this test is about the scale command's refusal."""

    def observe(self):
        return []

    def start(self, name, role, revision, shape):
        return {}

    def drain(self, name): ...
    def stop(self, name, force=False, reason=""): ...
    def set_traffic(self, split): ...
    def apply_in_place(self, settings): ...
    def relabel(self, names, revision): ...
    def wait_stopped(self): ...


def test_scaling_beyond_the_inventory_is_refused_with_the_counts(tmp_path, gpu_root):
    from trtpd.controller.controller import Controller
    from trtpd.controller.store import ControllerStore

    s = gpu_spec(tmp_path, gpu_root)
    store = ControllerStore(tmp_path / "state" / "controller.db")
    n = store.add_revision(s.to_yaml(), s.spec_json(), str(tmp_path / "dep.yaml"), "test")
    store.set_revision_status(n, "promoted")
    store.put_many({"stable_revision": n, "counts": s.counts()})
    c = Controller(store, IdleExecutor(), clock=lambda: 1000.0, samples=lambda since: [])
    too_many = store.submit("scale", {"counts": {"prefill": 3}}, "test")
    fits = store.submit("scale", {"counts": {"prefill": 2}}, "test")
    c.tick()
    assert store.command(too_many).result["error"] == (
        "scale to {'prefill': 3, 'decode': 1}: 10 GPUs needed (prefill 3x2 + decode 1x4) but the inventory "
        "gpus.devices has 8 ([0, 1, 2, 3, 4, 5, 6, 7]); add devices, or run fewer instances or a smaller tp")
    assert store.command(fits).status == "done" and store.get("counts") == {"prefill": 2, "decode": 1}
