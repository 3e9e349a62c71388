"""The stub registry, the dead-stub decision, the death record, the orphan exit, and `down`'s identity check."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trtpd.fleet import deployment
from trtpd.serving import stub_watch
from trtpd.serving.stub_watch import StubEntry, StubWatch
from trtpd.fleet.tritonserver import ServerPorts, ServerProcess


def wait_for(cond, timeout_s: float, what: str) -> float:
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        time.sleep(0.02)
    return time.monotonic() - start


@pytest.fixture
def sleeper():
    """A live process of ours (killed by pid at the end)."""
    proc = subprocess.Popen(["sleep", "300"])
    yield proc
    proc.kill()
    proc.wait()


def dead_pid() -> tuple[int, int]:
    """The pid and start time of a process that has exited."""
    proc = subprocess.Popen(["sleep", "300"])
    started = stub_watch.start_time(proc.pid)
    proc.kill()
    proc.wait()
    return proc.pid, started


def test_start_time_is_field_22_of_proc_stat():
    text = Path(f"/proc/{os.getpid()}/stat").read_text()
    assert stub_watch.start_time(os.getpid()) == int(text[text.rindex(")") + 2:].split()[19])
    pid, _ = dead_pid()
    assert stub_watch.start_time(pid) is None


def test_is_running_checks_pid_and_start_time(sleeper):
    started = stub_watch.start_time(sleeper.pid)
    assert stub_watch.is_running(sleeper.pid, started)
    assert not stub_watch.is_running(sleeper.pid, started + 1)     # the pid was reused by another process
    pid, started = dead_pid()
    assert not stub_watch.is_running(pid, started)


def test_register_writes_a_private_entry_and_reads_back(tmp_path):
    entry = stub_watch.register(tmp_path, "decode", "decode_0")
    path = tmp_path / "stubs" / f"decode-{os.getpid()}.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text())["instance"] == "decode_0"
    assert entry == StubEntry(os.getpid(), stub_watch.start_time(os.getpid()), "decode", "decode_0", os.getppid())
    (tmp_path / "stubs" / "broken.json").write_text("{not json")
    assert stub_watch.read_registry(tmp_path) == [entry]
    assert list((tmp_path / "stubs").glob(".*")) == []          # no temporary file left


def test_first_death_record_wins_and_is_private(tmp_path):
    path = tmp_path / stub_watch.DEATHS_FILE
    assert stub_watch.write_private(path, {"model": "decode"}, exclusive=True)
    assert not stub_watch.write_private(path, {"model": "prefill"}, exclusive=True)
    assert stub_watch.read_death(tmp_path) == {"model": "decode"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_dead_peers_are_of_my_server_only_and_never_me():
    me = StubEntry(10, 1, "disagg_bls", "disagg_bls_0", 5, True)
    decode = StubEntry(11, 2, "decode", "decode_0", 5)
    prefill = StubEntry(12, 3, "prefill", "prefill_0", 5)
    other_server = StubEntry(13, 4, "decode", "decode_0", 6)
    alive = {12}
    dead = stub_watch.dead_peers([me, decode, prefill, other_server], me, lambda pid, st: pid in alive)
    assert dead == [decode]


def test_death_record_names_the_model_and_counts_failures():
    dead = StubEntry(11, 2, "decode", "decode_0", 5)
    me = StubEntry(10, 1, "disagg_bls", "disagg_bls_0", 5, True)
    record = stub_watch.death_record(dead, me, 3, 1000.0)
    assert record["message"] == ("model 'decode' (stub pid 11) died; the deployment is stopping, "
                                 "retry after `trtpd up`")
    line = stub_watch.format_death(record)
    assert "model 'decode' (stub pid 11) died" in line and "disagg_bls (pid 10)" in line
    assert "in-flight requests failed: 3" in line
    assert "failed: unknown" in stub_watch.format_death({**record, "failed_requests": None})


def write_entry(state_dir: Path, entry: StubEntry) -> None:
    stub_watch.write_private(state_dir / "stubs" / entry.file_name, entry.__dict__)


def test_orchestrator_fails_its_requests_then_records_and_stops_the_server(tmp_path):
    failed_with, kills, events = [], [], []
    watch = StubWatch(tmp_path, "disagg_bls", "disagg_bls_0",
                      lambda msg: failed_with.append(msg) or events.append("fail") or 3, start=False)
    watch.kill = lambda pid, sig: kills.append((pid, sig)) or events.append("SIGTERM")
    watch.sleep = lambda s: events.append(("wait", s))
    watch.check()
    assert not failed_with and not kills                            # nobody dead yet
    pid, started = dead_pid()
    write_entry(tmp_path, StubEntry(pid, started, "decode", "decode_0", os.getppid()))
    watch.check()
    assert failed_with == [f"model 'decode' (stub pid {pid}) died; the deployment is stopping, retry after `trtpd up`"]
    assert kills == [(os.getppid(), signal.SIGTERM)]
    # the errors get DELIVER_S to reach their clients before tritonserver closes its endpoints (CI saw every
    # stream end "Stream removed (Socket closed)" when SIGTERM followed the failures at once)
    assert events == ["fail", ("wait", stub_watch.DELIVER_S), "SIGTERM"] and stub_watch.DELIVER_S >= 0.5
    record = stub_watch.read_death(tmp_path)
    assert record["model"] == "decode" and record["pid"] == pid and record["failed_requests"] == 3
    watch.check()
    assert len(failed_with) == 1 and len(kills) == 1                # handled once


def test_a_model_is_alive_until_its_stub_dies_read_now_not_at_the_next_poll(tmp_path, sleeper):
    """The entry's orchestrator asks after a generation request failed in TensorRT-LLM's words (bls_model.py
    _OwnServer._alive): a prefill stub that died answers False before any watch has polled or recorded it."""
    watch = StubWatch(tmp_path, "disagg_bls", "disagg_bls_0", lambda msg: 0, start=False)
    write_entry(tmp_path, StubEntry(sleeper.pid, stub_watch.start_time(sleeper.pid), "decode", "decode_0",
                                    os.getppid()))
    assert watch.model_alive("prefill") and watch.model_alive("decode")      # not registered: no death known
    pid, started = dead_pid()
    write_entry(tmp_path, StubEntry(pid, started, "prefill", "prefill_0", os.getppid()))
    assert not watch.model_alive("prefill") and watch.model_alive("decode")
    assert stub_watch.read_death(tmp_path) is None                           # nothing recorded yet


def test_role_stub_leaves_the_first_move_to_a_live_orchestrator(tmp_path, sleeper):
    kills = []
    watch = StubWatch(tmp_path, "prefill", "prefill_0", start=False)
    watch.kill = lambda pid, sig: kills.append((pid, sig))
    watch.grace_s = 0.3
    write_entry(tmp_path, StubEntry(sleeper.pid, stub_watch.start_time(sleeper.pid), "disagg_bls", "b_0",
                                    os.getppid(), True))
    pid, started = dead_pid()
    write_entry(tmp_path, StubEntry(pid, started, "decode", "decode_0", os.getppid()))
    watch.check()
    assert not kills and stub_watch.read_death(tmp_path) is None
    waited = wait_for(lambda: watch.check() or kills, 2.0, "the role stub acts after the grace period")
    assert waited >= 0.2
    assert stub_watch.read_death(tmp_path)["failed_requests"] is None


def test_orderly_stop_deregisters_and_stopping_mark_silences(tmp_path):
    kills = []
    watch = StubWatch(tmp_path, "decode", "decode_0", start=False)
    watch.kill = lambda pid, sig: kills.append((pid, sig))
    assert stub_watch.read_registry(tmp_path) == [watch.me]
    pid, started = dead_pid()
    write_entry(tmp_path, StubEntry(pid, started, "prefill", "prefill_0", os.getppid()))
    stub_watch.mark_stopping(tmp_path)
    watch.check()
    assert not kills and stub_watch.read_death(tmp_path) is None
    watch.stop()
    assert watch.me not in stub_watch.read_registry(tmp_path)
    stub_watch.clear_state(tmp_path)
    assert stub_watch.read_registry(tmp_path) == [] and not (tmp_path / stub_watch.STOPPING_FILE).exists()


ORPHAN = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", '''
import signal, sys
from trtpd.serving.stub_watch import StubWatch
StubWatch(sys.argv[1], "decode", "decode_0", poll_s=0.05)
print("registered", flush=True)
signal.pause()
''', sys.argv[1]], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
assert child.stdout.readline().strip() == "registered"
print(child.pid, flush=True)
os._exit(0)      # the "tritonserver" dies without a word
"""


def test_orphaned_stub_exits_and_removes_the_server_shm(tmp_path):
    prefix = f"trtpdunit{os.getpid()}_"
    shm = Path("/dev/shm") / f"{prefix}pool"
    shm.write_bytes(b"x")
    try:
        env = {**os.environ, stub_watch.SHM_ENV: prefix}
        out = subprocess.run([sys.executable, "-c", ORPHAN, str(tmp_path)], capture_output=True, text=True,
                             env=env, timeout=60)
        assert out.returncode == 0, out.stderr
        pid = int(out.stdout.split()[-1])
        started = stub_watch.start_time(pid)
        waited = wait_for(lambda: not stub_watch.is_running(pid, started), 3.0, "the orphaned stub exits")
        print(f"orphaned stub exited {waited:.2f} s after its parent")
        assert not shm.exists()
        assert stub_watch.read_registry(tmp_path) == []
    finally:
        shm.unlink(missing_ok=True)


def fake_deployment(home: Path, name: str, proc, start_time: int) -> None:
    folder = home / "deployments" / name
    folder.mkdir(parents=True)
    server = ServerProcess(proc.pid, "127.0.0.1", ServerPorts(1, 2, 3), str(folder / "repo"), str(folder / "log"),
                           f"trtpdunit{proc.pid}_", "", start_time)
    deployment.Deployment(name, "disaggregated", server, time.time(), "/nowhere").save()


def test_down_refuses_to_signal_a_pid_that_is_not_its_server(tmp_path, monkeypatch, sleeper):
    monkeypatch.setenv("TRTPD_HOME", str(tmp_path))
    fake_deployment(tmp_path, "reused", sleeper, stub_watch.start_time(sleeper.pid) + 7)
    dep = deployment.Deployment.load("reused")
    assert dep.state() == ("exited", f"pid {sleeper.pid} is no longer this deployment's tritonserver")
    dep = deployment.down("reused")
    assert dep.note == f"pid {sleeper.pid} is no longer this deployment's tritonserver; nothing signalled"
    assert sleeper.poll() is None and stub_watch.is_running(sleeper.pid, stub_watch.start_time(sleeper.pid))
    assert not (tmp_path / "deployments" / "reused" / "fleet.json").exists()


def test_down_signals_its_own_server(tmp_path, monkeypatch, sleeper):
    monkeypatch.setenv("TRTPD_HOME", str(tmp_path))
    fake_deployment(tmp_path, "ours", sleeper, stub_watch.start_time(sleeper.pid))
    started = stub_watch.start_time(sleeper.pid)
    dep = deployment.down("ours", timeout_s=5)
    assert dep.note == ""
    assert not stub_watch.is_running(sleeper.pid, started)     # SIGTERMed (and reaped by stop_server)


def test_stop_server_ends_the_guards_of_its_stubs(tmp_path, sleeper):
    """A guard notices its stub's exit only at its next poll (slower under load): `trtpd down` returned in a
    clean-clone run with a guard still running. stop_server ends the guards of its server, and only those."""
    stubs = [subprocess.Popen(["sleep", "300"]) for _ in range(2)]
    other_server = subprocess.Popen(["sleep", "300"])
    guards = []
    try:
        for stub, server_pid in zip(stubs, (sleeper.pid, other_server.pid)):
            guards.append(subprocess.Popen(
                [sys.executable, "-m", "trtpd.serving.stub_watch", "guard", str(stub.pid),
                 str(stub_watch.start_time(stub.pid)), str(server_pid), str(stub_watch.start_time(server_pid)),
                 str(tmp_path)], env={**os.environ, "TRTPD_SHM_PREFIX": ""}))
        wait_for(lambda: all("trtpd.serving.stub_watch" in stub_watch.cmdline(g.pid) for g in guards), 10, "guards")
        for guard in guards:            # between two polls, as long as it takes (a guard cannot end itself now)
            os.kill(guard.pid, signal.SIGSTOP)
        ours = stub_watch.leftover_helpers(sleeper.pid, stub_watch.start_time(sleeper.pid))
        assert list(ours) == [guards[0].pid]
        server = ServerProcess(sleeper.pid, "127.0.0.1", ServerPorts(1, 2, 3), str(tmp_path / "repo"),
                               str(tmp_path / "log"), "trtpdunitnone_", "", stub_watch.start_time(sleeper.pid))
        from trtpd.fleet.tritonserver import stop_server
        stop_server(server, timeout_s=5)
        assert guards[0].poll() is not None                   # ended by the time stop_server returns
        assert guards[1].poll() is None                       # another server's guard is spared
    finally:
        for proc in (*guards, *stubs, other_server):
            proc.kill()
            proc.wait()
