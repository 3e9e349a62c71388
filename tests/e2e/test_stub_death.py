"""A dead stub is seen and handled: SIGKILL of a role model's python-backend stub under streaming load fails
every in-flight request at once with an error naming the dead model, the deployment stops (readiness false)
and leaves nothing behind; a SIGKILLed tritonserver's stubs exit by themselves; `down` is quick under load.
Each test starts its own deployment (destructive) and always stops it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from trtpd.bench.client import BenchRequest, run_stream
from trtpd.deploy.spec import ReferenceDeployment
from trtpd.fleet import deployment
from trtpd.serving import stub_watch

pytestmark = pytest.mark.e2e
NUM_STREAMS = 8
MAX_TOKENS = 200
ANSWER_BOUND_S = 10.0      # SIGKILL -> every in-flight request has its error
READY_BOUND_S = 10.0       # SIGKILL -> GET /v2/health/ready is false
GONE_BOUND_S = 20.0        # SIGKILL -> no stub, no tritonserver, no /dev/shm file of the deployment
DOWN_BOUND_S = 10.0
TRTPD = Path(sys.executable).parent / "trtpd"


def wait_for(cond, timeout_s: float, what: str, poll_s: float = 0.05) -> float:
    """Seconds until `cond()` held; fails the test after `timeout_s`."""
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        time.sleep(poll_s)
    return time.monotonic() - start


def stubs(server) -> dict[int, str]:
    """pid -> model of every python-backend stub serving a model of this server's repository."""
    marker = server.repo.rstrip("/") + "/"
    found = {}
    for pid in stub_watch.all_pids():
        cmd = stub_watch.cmdline(pid).split()
        if cmd and cmd[0].endswith("triton_python_backend_stub") and len(cmd) > 1 and cmd[1].startswith(marker):
            if stub_watch.is_running(pid, None):
                found[pid] = cmd[1][len(marker):].split("/")[0]
    return found


def helpers(server) -> list[int]:
    """The stubs' guard processes and the reaper (`python -m trtpd.serving.stub_watch ...`) of this deployment."""
    folder = str(Path(server.repo).parent)
    return [pid for pid in stub_watch.all_pids() if "trtpd.serving.stub_watch" in (cmd := stub_watch.cmdline(pid))
            and folder in cmd and stub_watch.is_running(pid, None)]


def shm_files(server) -> list[str]:
    return sorted(p.name for p in Path("/dev/shm").glob(f"{server.shm_prefix}*"))


def nothing_left(server) -> bool:
    return not server.is_alive() and not stubs(server) and not shm_files(server) and not helpers(server)


class Load:
    """NUM_STREAMS streaming requests on one gRPC stream, in the background; records when each ended."""

    def __init__(self, server, name: str) -> None:
        self.server = server
        self.ended_at: dict[str, float] = {}
        reqs = [BenchRequest(f"{name}-{i}", f"stream number {i} tells a long story about", MAX_TOKENS, 0.0)
                for i in range(NUM_STREAMS)]
        self.results = []
        self.thread = threading.Thread(target=self._run, args=(reqs,), daemon=True)
        self.thread.start()

    def _run(self, reqs) -> None:
        self.results = run_stream(self.server.grpc_url, reqs, timeout_s=60.0,
                                  on_done=lambda r: self.ended_at.setdefault(r.request_id, time.monotonic()))

    def decode_active(self) -> float:
        text = _metrics(self.server)
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("nv_trt_llm_request_metrics{") and 'model="decode"' in line
                   and 'request_type="active"' in line)

    def wait_all_streaming(self) -> None:
        wait_for(lambda: self.decode_active() >= NUM_STREAMS, 60.0, f"{NUM_STREAMS} streams decoding", 0.02)
        assert not self.ended_at, "requests ended before the kill: make them longer"


def _metrics(server) -> str:
    import urllib.request
    return urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()


def start(name: str, fp16_root) -> deployment.Deployment:
    return deployment.up(name, ReferenceDeployment(fp16_root, mode="disaggregated"), replace=True)


def stop(name: str) -> None:
    try:
        deployment.down(name)
    except Exception as exc:   # already gone
        print(f"down {name}: {exc}")


def kill_role_stub_under_load(model: str, fp16_root) -> None:
    name = f"stubdeath-{model}-{os.getpid()}"
    dep = start(name, fp16_root)
    server = dep.server
    try:
        victim = [pid for pid, m in stubs(server).items() if m == model]
        assert len(victim) == 1, stubs(server)
        victim = victim[0]
        load = Load(server, name)
        load.wait_all_streaming()
        killed_at = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        ready_false_s = wait_for(lambda: not server.is_ready(0.5), READY_BOUND_S, "readiness turns false")
        load.thread.join(ANSWER_BOUND_S + 5)
        assert not load.thread.is_alive(), "the streams did not end"
        answer_s = max(t - killed_at for t in load.ended_at.values())
        expected = f"model '{model}' (stub pid {victim}) died; the deployment is stopping, retry after `trtpd up`"
        errors = [r.error for r in load.results]
        assert all(e and expected in e for e in errors), errors
        assert len(load.ended_at) == NUM_STREAMS and answer_s <= ANSWER_BOUND_S

        record = stub_watch.read_death(dep.folder)
        assert record["model"] == model and record["pid"] == victim and record["server_pid"] == server.pid
        assert record["failed_requests"] == NUM_STREAMS, record
        status = subprocess.run([str(TRTPD), "status", "--name", name], capture_output=True, text=True,
                                timeout=60, env={**os.environ, "COLUMNS": "250"})
        assert status.returncode == 0, status.stderr
        assert f"{name}: failed: model '{model}' (stub pid {victim}) died" in status.stdout, status.stdout
        assert f"in-flight requests failed: {NUM_STREAMS}" in status.stdout

        gone_s = wait_for(lambda: nothing_left(server), GONE_BOUND_S, "the stubs, server and /dev/shm files go")
        print(f"\nSIGKILL {model} stub (pid {victim}) under {NUM_STREAMS} streams: readiness false after "
              f"{ready_false_s:.2f} s, every request failed within {answer_s:.2f} s, server, stubs and "
              f"/dev/shm gone after {gone_s:.2f} s")
    finally:
        stop(name)
    assert not stubs(server) and not shm_files(server)


def test_sigkill_of_the_decode_stub_fails_fast_and_stops_the_deployment(trtpd_home, fp16_root):
    kill_role_stub_under_load("decode", fp16_root)


def test_sigkill_of_the_prefill_stub_fails_fast_and_stops_the_deployment(trtpd_home, fp16_root):
    kill_role_stub_under_load("prefill", fp16_root)


def test_stubs_of_a_sigkilled_tritonserver_exit_and_up_cleans_the_rest(trtpd_home, fp16_root):
    name = f"stubdeath-server-{os.getpid()}"
    first = start(name, fp16_root).server
    second = None
    try:
        orphans = stubs(first)
        assert set(orphans.values()) >= {"prefill", "decode", "disagg_bls", "preprocessing", "postprocessing"}
        killed_at = time.monotonic()
        os.kill(first.pid, signal.SIGKILL)
        exit_s = wait_for(lambda: not stubs(first) and not helpers(first), 5.0,
                          "the orphaned stubs (and their guards) exit by themselves")
        wait_for(lambda: not shm_files(first), 5.0, "the orphaned stubs remove the /dev/shm files")
        print(f"\nSIGKILL tritonserver: its {len(orphans)} stubs exited {exit_s:.2f} s later "
              f"({time.monotonic() - killed_at:.2f} s with the shm files)")
        state, reason = deployment.Deployment.load(name).state()
        assert state == "exited" and "is not running" in reason
        second = start(name, fp16_root).server
        assert second.pid != first.pid and second.is_ready()
        assert not list((deployment.deployment_dir(name) / "stubs").glob(f"*-{min(orphans)}.json"))
        assert stub_watch.read_death(deployment.deployment_dir(name)) is None
        assert len(stubs(second)) == len(orphans)
    finally:
        stop(name)
    for server in (first, second):
        if server is not None:
            assert nothing_left(server), (stubs(server), shm_files(server))


def test_down_under_streaming_load_is_quick_and_leaves_nothing(trtpd_home, fp16_root):
    name = f"stubdeath-down-{os.getpid()}"
    server = start(name, fp16_root).server
    try:
        load = Load(server, name)
        load.wait_all_streaming()
        started = time.monotonic()
        down = subprocess.run([str(TRTPD), "down", "--name", name], capture_output=True, text=True, timeout=60)
        down_s = time.monotonic() - started
        assert down.returncode == 0 and f"stopped {name}" in down.stdout, down.stdout + down.stderr
        print(f"\n`trtpd down` under {NUM_STREAMS} streams: {down_s:.2f} s")
        assert down_s <= DOWN_BOUND_S
        assert nothing_left(server), (stubs(server), shm_files(server))
        load.thread.join(30)
        assert not load.thread.is_alive() and all(r.done for r in load.results)
        assert stub_watch.read_death(deployment.deployment_dir(name)) is None   # an orderly stop is no death
    finally:
        stop(name)
