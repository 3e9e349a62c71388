"""A tritonserver start-up that crashed (the python backend of this Triton release aborts now and then while its
stubs start: boost::interprocess::lock_exception) or lost a picked port to another program is started again,
once; a configuration error is reported at once. Ports are picked outside the kernel's ephemeral range, and
processes are signalled only while their pid is still theirs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from trtpd.serving import stub_watch
from trtpd.fleet.tritonserver import (START_ATTEMPTS, ServerPorts, ServerProcess, ServerStartError,
                                        _bindable, ephemeral_port_range, free_port, listen_port_candidates,
                                        start_retry_reason, start_until_ready, stop_server)

# stands in for tritonserver: aborts, fails like a taken port or a bad model, or answers 200 on HTTP and metrics
FAKE_SERVER = r"""
import http.server, os, sys, threading
mode, http_port, metrics_port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if mode == "abort":
    print("terminate called after throwing an instance of 'boost::interprocess::lock_exception'", flush=True)
    os.abort()
if mode == "port":
    print(f"failed to start Metrics service: Unavailable - Socket '127.0.0.1:{metrics_port}' already in use", flush=True)
    sys.exit(1)
if mode == "config":
    print("failed to load 'prefill' version 1: Invalid argument: unexpected key", flush=True)
    sys.exit(1)
class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
for port in (metrics_port, http_port):
    threading.Thread(target=http.server.ThreadingHTTPServer(("127.0.0.1", port), Ok).serve_forever, daemon=True).start()
threading.Event().wait()
"""


class FakeStarts:
    """start(ports) for start_until_ready: each start runs the next mode of `modes`."""

    def __init__(self, tmp_path: Path, modes: list[str]) -> None:
        self.tmp_path, self.modes = tmp_path, list(modes)
        self.servers: list[ServerProcess] = []
        self.log = tmp_path / "server.log"

    def __call__(self, ports: ServerPorts | None) -> ServerProcess:
        ports = ports or ServerPorts.pick()
        offset = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as log:
            proc = subprocess.Popen([sys.executable, "-c", FAKE_SERVER, self.modes.pop(0), str(ports.http),
                                     str(ports.metrics)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        server = ServerProcess(proc.pid, "127.0.0.1", ports, str(self.tmp_path / "repo"), str(self.log),
                               f"trtpdtest{os.getpid()}_", "", stub_watch.start_time(proc.pid) or 0)
        server._popen, server._log_offset = proc, offset
        self.servers.append(server)
        return server

    def stop_all(self) -> None:
        for server in self.servers:
            stop_server(server, timeout_s=5)


@pytest.fixture
def starts(tmp_path):
    made: list[FakeStarts] = []

    def make(modes: list[str]) -> FakeStarts:
        made.append(FakeStarts(tmp_path, modes))
        return made[-1]
    yield make
    for fake in made:
        fake.stop_all()


def test_a_start_that_crashed_is_started_again_and_its_exit_status_is_read(starts):
    fake = starts(["abort", "serve"])
    server = start_until_ready(fake, None, timeout_s=30)
    first, second = fake.servers
    assert server is second and server.is_alive() and server.is_ready()
    assert first.exit_status() == -signal.SIGABRT and not first.is_alive()
    assert "lock_exception" in first.log_since_start() and "lock_exception" not in second.log_since_start()


def test_a_start_that_lost_a_picked_port_is_started_again_on_new_ports(starts):
    fake = starts(["port", "serve"])
    server = start_until_ready(fake, None, timeout_s=30)
    first, second = fake.servers
    assert server is second and first.exit_status() == 1
    assert first.ports != second.ports


def test_ports_the_user_named_a_config_error_and_a_second_crash_are_reported(starts):
    named = ServerPorts.pick()
    fake = starts(["port", "serve"])
    with pytest.raises(ServerStartError, match=r"exit code 1") as err:
        start_until_ready(fake, named, timeout_s=30)     # the user's port is taken: say so, do not move it
    assert len(fake.servers) == 1 and err.value.returncode == 1 and "already in use" in str(err.value)
    fake = starts(["config", "serve"])
    with pytest.raises(ServerStartError, match=r"exit code 1"):
        start_until_ready(fake, None, timeout_s=30)
    assert len(fake.servers) == 1
    fake = starts(["abort"] * START_ATTEMPTS + ["serve"])
    with pytest.raises(ServerStartError, match=r"killed by signal 6") as err:
        start_until_ready(fake, None, timeout_s=30)
    assert len(fake.servers) == START_ATTEMPTS and err.value.returncode == -signal.SIGABRT
    assert not any(s.is_alive() for s in fake.servers)


def test_retry_reasons():
    assert start_retry_reason(-6, "", ports_picked=False) == "it crashed (SIGABRT)"
    assert start_retry_reason(-11, "", ports_picked=True) == "it crashed (SIGSEGV)"
    taken = "E1201 main.cc:293] \"failed to start Metrics service: Unavailable - Socket '127.0.0.1:60583' already in use\""
    assert start_retry_reason(1, taken, ports_picked=True) == "a port picked for it was taken before it could listen on it"
    assert start_retry_reason(1, taken, ports_picked=False) is None     # a port the user named
    assert start_retry_reason(1, "failed to load all models", ports_picked=True) is None
    assert start_retry_reason(None, taken, ports_picked=True) is not None   # (not our child: the log still tells)
    assert start_retry_reason(0, "", ports_picked=True) is None


def test_ports_are_picked_outside_the_ephemeral_range():
    assert listen_port_candidates((32768, 60999)) == range(20000, 32768)
    assert listen_port_candidates((1024, 65535)) is None and listen_port_candidates((20500, 60999)) is None
    low, high = ephemeral_port_range()
    candidates = listen_port_candidates((low, high))
    picked = {free_port() for _ in range(20)}
    if candidates is not None:
        assert all(p in candidates for p in picked) and not any(low <= p <= high for p in picked)
    assert len(picked) > 1 and all(_bindable(p, "127.0.0.1") for p in picked)
    ports = ServerPorts.pick()
    assert len({ports.http, ports.grpc, ports.metrics}) == 3


def test_a_process_is_signalled_only_while_its_pid_is_still_its_own():
    proc = subprocess.Popen(["sleep", "60"])
    try:
        started = stub_watch.start_time(proc.pid)
        assert not stub_watch.signal_exact(proc.pid, started + 1, signal.SIGKILL)   # another process's start time
        assert stub_watch.kill_and_wait({proc.pid: started + 1}, timeout_s=0.2) == []  # spared, not waited for
        assert proc.poll() is None
        assert stub_watch.kill_and_wait({proc.pid: started}) == []
        assert proc.wait(5) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.wait()
