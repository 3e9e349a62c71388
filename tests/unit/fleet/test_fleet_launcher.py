"""fleet_up's order (decode before prefill, fleet.json after each start), its cleanup on failure, and the
lone stub's death report (a one-model instance server has no peer stub to notice)."""

from __future__ import annotations

import signal
import subprocess

import pytest

from trtpd.errors import ConfigError, TrtpdError
from trtpd.fleet import launcher, records
from trtpd.fleet.launcher import fleet_up, plan_waves
from trtpd.fleet.records import InstanceRecord
from trtpd.deploy.spec import ReferenceDeployment
from trtpd.serving import stub_watch
from trtpd.serving.stub_watch import StubEntry
from trtpd.fleet.tritonserver import ServerProcess, ServerStartError


class FakeStarter:
    def __init__(self, fail_on: str | None = None, start_failures: dict[str, list[ServerStartError]] | None = None):
        self.events: list[tuple[str, str, int]] = []    # (what, instance, instances in fleet.json then)
        self.fail_on = fail_on
        self.start_failures = start_failures or {}      # instance -> how its next starts exit, in turn
        self.ports: list[tuple[str, int, int]] = []      # (instance, HTTP port, KV port) of every start

    def start(self, fleet, plan):
        on_disk = len(records.load_fleet(fleet.name).instances)
        self.events.append(("start", plan.name, on_disk))
        self.ports.append((plan.name, plan.ports.http, plan.kv_port))
        server = ServerProcess(100000 + len(self.events), "127.0.0.1", plan.ports, "/repo", "/log", "p_")
        kv = f"127.0.0.1:{plan.kv_port}" if plan.kv_port else ""
        return InstanceRecord(plan.name, plan.role, plan.role, server, "/e", "shm", kv, kv, plan.cpus, 1, 1, 1, 1)

    def wait_ready(self, inst, timeout_s):
        self.events.append(("ready", inst.name, len(records.load_fleet("f").instances)))
        if inst.name == self.fail_on:
            raise TrtpdError(f"{inst.name} never became ready")
        if self.start_failures.get(inst.name):
            raise self.start_failures[inst.name].pop(0)

    def stop(self, inst):
        self.events.append(("stop", inst.name, -1))


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRTPD_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_decode_instances_start_and_are_ready_before_prefill(home, fp16_root):
    starter = FakeStarter()
    fleet = fleet_up("f", ReferenceDeployment(fp16_root), prefill=2, decode=2, starter=starter, cpus=[0, 1])
    assert [(e[0], e[1]) for e in starter.events] == [
        ("start", "decode-0"), ("start", "decode-1"), ("ready", "decode-0"), ("ready", "decode-1"),
        ("start", "prefill-0"), ("start", "prefill-1"), ("ready", "prefill-0"), ("ready", "prefill-1")]
    # fleet.json names every instance started before the next one starts
    assert [e[2] for e in starter.events if e[0] == "start"] == [0, 1, 2, 3]
    assert [i.name for i in records.load_fleet("f").instances] == ["decode-0", "decode-1", "prefill-0", "prefill-1"]
    assert [i.cpus for i in fleet.instances] == [[0], [1], [0], [1]]
    assert records.load_fleet("f").tokenizer_dir.endswith("checkpoint")


def test_a_failed_start_stops_everything_started_and_removes_the_record(home, fp16_root):
    starter = FakeStarter(fail_on="prefill-0")
    with pytest.raises(TrtpdError, match="prefill-0 never became ready"):
        fleet_up("f", ReferenceDeployment(fp16_root), prefill=1, decode=2, starter=starter)
    assert [e[1] for e in starter.events if e[0] == "stop"] == ["prefill-0", "decode-1", "decode-0"]
    assert not records.is_fleet("f")


def test_an_instance_that_crashed_or_lost_a_port_while_starting_is_started_again(home, fp16_root):
    crashed = ServerStartError("tritonserver exited during startup (killed by signal 6)", -6,
                               "terminate called after throwing an instance of 'boost::interprocess::lock_exception'")
    port_taken = ServerStartError("tritonserver exited during startup (exit code 1)", 1,
                                  "failed to start Metrics service: Unavailable - Socket '127.0.0.1:1' already in use")
    starter = FakeStarter(start_failures={"decode-0": [crashed], "prefill-0": [port_taken]})
    fleet = fleet_up("f", ReferenceDeployment(fp16_root), prefill=1, decode=1, starter=starter)
    assert [(e[0], e[1]) for e in starter.events] == [
        ("start", "decode-0"), ("ready", "decode-0"), ("stop", "decode-0"), ("start", "decode-0"), ("ready", "decode-0"),
        ("start", "prefill-0"), ("ready", "prefill-0"), ("stop", "prefill-0"), ("start", "prefill-0"),
        ("ready", "prefill-0")]
    on_disk = records.load_fleet("f").instances
    assert [i.name for i in on_disk] == ["decode-0", "prefill-0"]          # the new start took the old one's place
    assert [i.server.pid for i in on_disk] == [i.server.pid for i in fleet.instances]
    # a start again gets new ports (the OS may hand a failed attempt's port to the next instance: it never listened)
    http = {name: [port for n, port, _ in starter.ports if n == name] for name in ("decode-0", "prefill-0")}
    assert all(len(set(ports)) == 2 for ports in http.values()), http
    assert on_disk[1].server.ports.http == http["prefill-0"][-1] != on_disk[0].server.ports.http
    kv = [kv_port for name, _, kv_port in starter.ports if name == "prefill-0"]
    assert len(set(kv)) == 2 and on_disk[1].kv_bind == f"127.0.0.1:{kv[-1]}" and on_disk[0].kv_bind == ""


def test_a_start_that_fails_again_or_for_a_config_error_is_not_retried(home, fp16_root):
    crash = ServerStartError("crashed", -11, "")
    bad_model = ServerStartError("tritonserver exited during startup (exit code 1)", 1,
                                 "failed to load 'prefill' version 1: Invalid argument: unexpected key")
    starter = FakeStarter(start_failures={"decode-0": [crash, crash]})
    with pytest.raises(ServerStartError, match="crashed"):
        fleet_up("f", ReferenceDeployment(fp16_root), prefill=1, decode=1, starter=starter)
    assert [e[1] for e in starter.events if e[0] == "start"] == ["decode-0", "decode-0"]     # 2 starts in all
    assert not records.is_fleet("f")
    starter = FakeStarter(start_failures={"decode-0": [bad_model]})
    with pytest.raises(ServerStartError, match="exit code 1"):
        fleet_up("f", ReferenceDeployment(fp16_root), prefill=1, decode=1, starter=starter)
    assert [e[1] for e in starter.events if e[0] == "start"] == ["decode-0"]
    assert not records.is_fleet("f")


def test_plans_get_distinct_ports_and_only_prefill_a_kv_port():
    waves = plan_waves(2, 2, 0)
    assert [[p.role for p in w] for w in waves] == [["decode", "decode"], ["prefill", "prefill"]]
    plans = [p for w in waves for p in w]
    ports = [x for p in plans for x in (p.ports.http, p.ports.grpc, p.ports.metrics)] + \
        [p.kv_port for p in plans if p.role == "prefill"]
    assert len(set(ports)) == len(ports) == 14
    assert all(p.kv_port == 0 for p in plans if p.role == "decode")
    assert [[p.name for p in w] for w in plan_waves(0, 0, 3)] == [["colocated-0", "colocated-1", "colocated-2"]]


@pytest.mark.parametrize("counts", [(1, 0, 0), (0, 1, 0), (1, 1, 1), (0, 0, 0)])
def test_counts_that_make_no_fleet_are_refused(counts):
    with pytest.raises(ConfigError, match="fleet"):
        launcher.fleet_mode(*counts)


# ---- the lone stub's guard ---------------------------------------------------------------------
@pytest.fixture
def server():
    proc = subprocess.Popen(["sleep", "300"])    # stands in for tritonserver (killed by pid at the end)
    yield proc.pid, stub_watch.start_time(proc.pid)
    proc.kill()
    proc.wait()


def dead_stub(state_dir, server_pid: int, model: str = "prefill") -> StubEntry:
    proc = subprocess.Popen(["sleep", "300"])
    entry = StubEntry(proc.pid, stub_watch.start_time(proc.pid), model, "prefill_0", server_pid)
    proc.kill()
    proc.wait()
    (state_dir / "stubs").mkdir(exist_ok=True)
    stub_watch.write_private(state_dir / "stubs" / entry.file_name, entry.__dict__)
    return entry


def test_a_lone_stub_that_died_is_reported_and_its_server_stopped(tmp_path, server):
    pid, started = server
    entry = dead_stub(tmp_path, pid)
    kills = []
    assert stub_watch.lone_death(entry.pid, pid, started, tmp_path, kill=lambda p, s: kills.append((p, s)))
    assert kills == [(pid, signal.SIGTERM)]
    record = stub_watch.read_death(tmp_path)
    assert (record["model"], record["pid"], record["server_pid"]) == ("prefill", entry.pid, pid)
    assert record["detected_by"].startswith("guard of prefill")
    # first writer wins: a second report does not signal again
    assert not stub_watch.lone_death(entry.pid, pid, started, tmp_path, kill=lambda p, s: kills.append((p, s)))
    assert len(kills) == 1


def test_no_report_when_a_peer_lives_deregistered_or_stopping(tmp_path, server):
    pid, started = server
    never = lambda p, s: pytest.fail("the server must not be signalled")   # noqa: E731
    entry = dead_stub(tmp_path, pid)
    peer = StubEntry(pid, started, "disagg_bls", "bls_0", pid, True)   # a live process standing in for a peer
    stub_watch.write_private(tmp_path / "stubs" / "disagg_bls-peer.json", peer.__dict__)
    assert not stub_watch.lone_death(entry.pid, pid, started, tmp_path, kill=never)   # the peer acts (single server)
    (tmp_path / "stubs" / "disagg_bls-peer.json").unlink()
    stub_watch.mark_stopping(tmp_path)
    assert not stub_watch.lone_death(entry.pid, pid, started, tmp_path, kill=never)   # trtpd down
    (tmp_path / stub_watch.STOPPING_FILE).unlink()
    (tmp_path / "stubs" / entry.file_name).unlink()
    assert not stub_watch.lone_death(entry.pid, pid, started, tmp_path, kill=never)   # finalize deregistered it
    entry = dead_stub(tmp_path, pid)
    assert not stub_watch.lone_death(entry.pid, pid, started + 1, tmp_path, kill=never)   # server gone
    assert stub_watch.read_death(tmp_path) is None
