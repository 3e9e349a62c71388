"""A dead python-backend stub is seen and handled: the deployment fails fast, like a pod whose container exits.

Why. In Triton 2.51 a decoupled model whose stub process died is never restarted: the model stays READY
and its in-flight requests never complete. So every trtpd python model registers its stub at initialize
(`<state_dir>/stubs/<model>-<pid>.json`: pid, start time, model, instance, server pid) and runs a
`StubWatch` thread that polls every 0.25 s:
- its parent is no longer the tritonserver it started under: the server is gone, the stub removes its
  registry entry and the server's /dev/shm files and exits (stubs never outlive their server). A stub
  whose threads wait forever on the dead server (holding the GIL) cannot run that check, so each stub
  also has a guard process (`python -m trtpd.serving.stub_watch guard`, stdlib only) that SIGKILLs it
  and cleans up when the server is gone, and exits when the stub does;
- another registered stub of the same server is dead (its pid gone, or reused: start time differs): it
  writes `<state_dir>/deaths.json` (first writer wins), the orchestrator fails its in-flight requests at once
  (`on_death`), and the detecting stub sends SIGTERM to tritonserver so readiness goes false (`DELIVER_S`
  after failing requests, so that their errors reach the clients before the endpoints close).
A role stub leaves the first move to a live orchestrator for `GRACE_S`, so the record counts the failed
requests. A stub deregisters in `stop()` (its model's finalize), and `<state_dir>/stopping` (written by
`trtpd down`) silences detection, so an orderly shutdown is never reported as a death.
The detecting stub also starts a small reaper (its own session, `python -m trtpd.serving.stub_watch`) that
waits for the server to exit, then kills the stubs it left (by pid) and removes its /dev/shm files: the
dead stub's KV pool and shared-memory region have no other owner.
The state folder comes from TRTPD_STATE_DIR (start_server sets it); unset (e.g. the GPU container): no watch.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from trtpd.process_identity import is_running, proc_stat, signal_exact, start_time  # noqa: F401 - re-exported

STATE_ENV = "TRTPD_STATE_DIR"
SHM_ENV = "TRTPD_SHM_PREFIX"
DEATHS_FILE = "deaths.json"
STOPPING_FILE = "stopping"
STOPPING_MESSAGE = "the deployment is stopping (trtpd down); retry once it is up again"
POLL_S = 0.25
GRACE_S = 2.0
# between failing the in-flight requests and SIGTERM: tritonserver stops its endpoints as the signal arrives
# (triton-inference-server/server src/main.cc: StopEndpoints, then TRITONSERVER_ServerStop), and an error response
# its gRPC frontend has not written to the client yet goes with the stream ("Stream removed (Socket closed)" instead
# of the death's message, seen once in CI on a loaded 2-core machine)
DELIVER_S = 1.0
KILL_WAIT_S = 5.0          # how long kill_and_wait waits for SIGKILLed processes to exit
log = logging.getLogger(__name__)


# ---- /proc (process identity: trtpd/process_identity.py) --------------------------------------
def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return ""


def all_pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


# ---- registry and death record ---------------------------------------------------------------
@dataclass(frozen=True)
class StubEntry:
    pid: int
    start_time: int
    model: str
    instance: str
    server_pid: int
    orchestrator: bool = False

    @property
    def file_name(self) -> str:
        return f"{self.model}-{self.pid}.json"


def write_private(path: Path, data: dict, exclusive: bool = False) -> bool:
    """Writes JSON atomically with mode 0600; with `exclusive` only if `path` does not exist yet (first
    writer wins). Returns whether this call wrote it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(data, indent=2))
        if not exclusive:
            os.replace(tmp, path)
            return True
        try:
            os.link(tmp, path)    # atomic, and fails when another writer was first
            return True
        except FileExistsError:
            return False
    finally:
        tmp.unlink(missing_ok=True)


def register(state_dir: Path, model: str, instance: str, orchestrator: bool = False) -> StubEntry:
    pid = os.getpid()
    entry = StubEntry(pid, start_time(pid) or 0, model, instance, os.getppid(), orchestrator)
    folder = Path(state_dir) / "stubs"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_private(folder / entry.file_name, asdict(entry))
    return entry


def read_registry(state_dir: Path) -> list[StubEntry]:
    entries = []
    for path in sorted((Path(state_dir) / "stubs").glob("*.json")):
        try:
            entries.append(StubEntry(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):   # half-removed or foreign file: not a stub of ours
            continue
    return entries


def dead_peers(entries: list[StubEntry], me: StubEntry,
               alive: Callable[[int, int | None], bool] = is_running) -> list[StubEntry]:
    """Registered stubs of my server, other than me, that no longer run."""
    return [e for e in entries if e.server_pid == me.server_pid and e.pid != me.pid
            and not alive(e.pid, e.start_time)]


def death_message(record: dict) -> str:
    return (f"model '{record['model']}' (stub pid {record['pid']}) died; the deployment is stopping, "
            f"retry after `trtpd up`")


def death_record(dead: StubEntry, detected_by: StubEntry, failed_requests: int | None, now: float) -> dict:
    record = {"model": dead.model, "instance": dead.instance, "pid": dead.pid, "server_pid": dead.server_pid,
              "detected_at": now, "detected_by": f"{detected_by.model} (pid {detected_by.pid})",
              "failed_requests": failed_requests}
    return {**record, "message": death_message(record)}


def read_death(state_dir: Path) -> dict | None:
    try:
        return json.loads((Path(state_dir) / DEATHS_FILE).read_text())
    except (OSError, ValueError):
        return None


def format_death(record: dict) -> str:
    """One line for `trtpd status`."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.get("detected_at", 0)))
    failed = record.get("failed_requests")
    failed = "unknown" if failed is None else str(failed)
    return (f"model '{record.get('model')}' (stub pid {record.get('pid')}) died; detected {when} by "
            f"{record.get('detected_by')}; in-flight requests failed: {failed}")


def mark_stopping(state_dir: Path, message: str = STOPPING_MESSAGE) -> None:
    """The server is being stopped on purpose; its stubs end what they serve with `message`."""
    write_private(Path(state_dir) / STOPPING_FILE, {"since": time.time(), "message": message})


def clear_state(state_dir: Path) -> None:
    """Removes the registry, the death record and the stopping mark (before a fresh start)."""
    state_dir = Path(state_dir)
    for path in (state_dir / "stubs").glob("*.json"):
        path.unlink(missing_ok=True)
    (state_dir / DEATHS_FILE).unlink(missing_ok=True)
    (state_dir / STOPPING_FILE).unlink(missing_ok=True)


def remove_shm(prefix: str) -> None:
    if prefix:
        for path in Path("/dev/shm").glob(f"{prefix}*"):
            path.unlink(missing_ok=True)


# ---- the watchdog ----------------------------------------------------------------------------
class StubWatch:
    """Registers this stub and watches its server and its peers (see the module docstring).
    `on_death(message)` fails the caller's in-flight requests and returns how many it failed."""

    def __init__(self, state_dir: Path, model: str, instance: str,
                 on_death: Callable[[str], int] | None = None, poll_s: float = POLL_S, start: bool = True,
                 on_stopping: Callable[[str], object] | None = None) -> None:
        self.state_dir = Path(state_dir)
        self.on_death = on_death
        # `trtpd down` marked the deployment stopping: end the requests in flight at once, so tritonserver
        # has none left to wait its exit timeout for
        self.on_stopping = on_stopping
        self._stopping_seen = False
        self.poll_s = poll_s
        self.grace_s = GRACE_S
        self.deliver_s = DELIVER_S
        self.kill = os.kill      # how the server is signalled (tests replace it)
        self.sleep = time.sleep
        self.me = register(self.state_dir, model, instance, orchestrator=on_death is not None)
        self._handled = False
        self._first_seen: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{model}-stub-watch", daemon=True)
        if start:
            self._thread.start()
            spawn_guard(self.me, self.state_dir)

    @classmethod
    def from_env(cls, model: str, instance: str, on_death: Callable[[str], int] | None = None,
                 on_stopping: Callable[[str], object] | None = None) -> "StubWatch | None":
        state_dir = os.environ.get(STATE_ENV)
        return cls(Path(state_dir), model, instance, on_death, on_stopping=on_stopping) if state_dir else None

    def model_alive(self, model: str) -> bool:
        """Whether `model`'s stubs in my server still run, read now (not at the next poll): False once one of them
        has died or a death record names it."""
        record = read_death(self.state_dir)
        if record is not None and record.get("server_pid") == self.me.server_pid and record.get("model") == model:
            return False
        return not any(e.model == model for e in dead_peers(read_registry(self.state_dir), self.me))

    def stop(self) -> None:
        """Orderly end (the model's finalize): deregister first, so no peer reports this exit as a death."""
        self._stop.set()
        (self.state_dir / "stubs" / self.me.file_name).unlink(missing_ok=True)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.check()
            except Exception:   # the watch must keep watching
                log.exception("stub watch of %s failed", self.me.model)

    def check(self) -> None:
        if os.getppid() != self.me.server_pid:   # tritonserver is gone: so are we
            self.stop()
            remove_shm(os.environ.get(SHM_ENV, ""))
            os._exit(1)
        if (self.state_dir / STOPPING_FILE).exists():
            if not self._stopping_seen and self.on_stopping is not None:
                self._stopping_seen = True
                try:
                    message = json.loads((self.state_dir / STOPPING_FILE).read_text()).get("message")
                except (OSError, ValueError):
                    message = None
                self.on_stopping(message or STOPPING_MESSAGE)
            return
        if self._handled:
            return
        record = read_death(self.state_dir)
        if record is not None and record.get("server_pid") == self.me.server_pid:
            self._handled = True            # another stub detected it: fail what we hold, once
            if self.on_death is not None:
                self.on_death(record["message"])
            return
        entries = read_registry(self.state_dir)
        dead = dead_peers(entries, self.me)
        if not dead:
            return
        now = time.time()
        self._first_seen = self._first_seen or now
        live_orchestrator = any(e.orchestrator and e not in dead and e.pid != self.me.pid for e in entries)
        if self.on_death is None and live_orchestrator and now - self._first_seen < self.grace_s:
            return                          # the orchestrator fails the requests and writes the record
        self._handled = True
        message = death_message({"model": dead[0].model, "pid": dead[0].pid})
        failed = self.on_death(message) if self.on_death is not None else None
        if write_private(self.state_dir / DEATHS_FILE, death_record(dead[0], self.me, failed, now), exclusive=True):
            log.error("%s; stopping tritonserver (pid %d)", message, self.me.server_pid)
            if failed:
                self.sleep(self.deliver_s)   # the failed requests' errors reach their clients first
            self.kill(self.me.server_pid, signal.SIGTERM)
            if self.kill is os.kill:
                spawn_reaper(self.me.server_pid)


# ---- leftovers of a server that is gone (trtpd down, trtpd up after a crash) -----------------
def leftover_stubs(repo: str, since: int) -> dict[int, int]:
    """Python-backend stubs serving a model of `repo` that started at or after `since` (clock ticks): pid ->
    start time, so the caller signals exactly those processes and never one that got a pid of theirs later."""
    marker = str(repo).rstrip("/") + "/"
    found = {}
    for pid in all_pids():
        if pid == os.getpid():
            continue
        started = start_time(pid)
        cmd = cmdline(pid)
        # (start time read before the command line: a pid reused in between shows the new command, not ours)
        if "triton_python_backend_stub" in cmd and marker in cmd and started is not None and started >= since \
                and start_time(pid) == started:
            found[pid] = started
    return found


def leftover_helpers(server_pid: int, server_start: int) -> dict[int, int]:
    """The guard processes and the reaper (`python -m trtpd.serving.stub_watch guard|reap ...`) of the server
    `server_pid` that started at `server_start`: pid -> start time. Once that server is stopped and its stubs
    and /dev/shm files are gone, their work is done; stop_server ends them so none outlives `trtpd down`."""
    found = {}
    for pid in all_pids():
        if pid == os.getpid():
            continue
        started = start_time(pid)
        argv = cmdline(pid).split()
        if "trtpd.serving.stub_watch" not in argv or started is None:
            continue
        at = argv.index("trtpd.serving.stub_watch") + 1
        args = argv[at:]
        server_args = args[3:5] if args[:1] == ["guard"] else args[1:3] if args[:1] == ["reap"] else []
        if server_args == [str(server_pid), str(server_start)] and start_time(pid) == started:
            found[pid] = started
    return found


def kill_and_wait(procs: dict[int, int], timeout_s: float = KILL_WAIT_S) -> list[int]:
    """SIGKILLs each process (pid -> its start time: a pid that now belongs to another process is spared) and
    waits until they are gone; returns the ones still there after `timeout_s`."""
    for pid, started in procs.items():
        signal_exact(pid, started, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    left = [p for p, st in procs.items() if is_running(p, st)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if is_running(p, procs[p])]
    return left


# ---- the reaper: after a death, cleans up behind the stopping server -----------------------------
REAP_TIMEOUT_S = 120.0


def server_repo(pid: int) -> str:
    for arg in cmdline(pid).split():
        if arg.startswith("--model-repository="):
            return arg.split("=", 1)[1]
    return ""


def spawn_reaper(server_pid: int) -> None:
    import subprocess
    python = _python()
    if python is None or not server_repo(server_pid):
        return
    subprocess.Popen([python, "-m", "trtpd.serving.stub_watch", "reap", str(server_pid), str(start_time(server_pid)),
                      server_repo(server_pid), os.environ.get(SHM_ENV, "")],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True, close_fds=True)


def reap(server_pid: int, server_start: int, repo: str, shm_prefix: str, timeout_s: float = REAP_TIMEOUT_S) -> None:
    """Waits (bounded) for the server to exit, then removes what it left behind."""
    deadline = time.monotonic() + timeout_s
    while is_running(server_pid, server_start):
        if time.monotonic() > deadline:
            return          # still running: `trtpd down` will stop it and clean up
        time.sleep(0.1)
    kill_and_wait(leftover_stubs(repo, server_start))
    remove_shm(shm_prefix)


def _python() -> str | None:
    import shutil
    return shutil.which("python3") or shutil.which("python")   # the venv's: start_server puts it first on PATH


def spawn_guard(me: StubEntry, state_dir: Path) -> None:
    import subprocess
    python = _python()
    if python is None:
        log.warning("no python3 on PATH: stub %s has no guard process", me.model)
        return
    subprocess.Popen([python, "-m", "trtpd.serving.stub_watch", "guard", str(me.pid), str(me.start_time),
                      str(me.server_pid), str(start_time(me.server_pid)), str(state_dir)],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)


def guard(stub_pid: int, stub_start: int, server_pid: int, server_start: int, state_dir: str,
          poll_s: float = POLL_S) -> None:
    """Runs beside a stub: when its server is gone, SIGKILLs the stub and removes what it leaves; when the
    stub dies first, reports it if no other stub can (lone_death) and cleans up behind the server."""
    repo = server_repo(server_pid)
    while is_running(stub_pid, stub_start):
        if not is_running(server_pid, server_start):
            kill_and_wait({stub_pid: stub_start})
            for path in (Path(state_dir) / "stubs").glob(f"*-{stub_pid}.json"):
                path.unlink(missing_ok=True)
            remove_shm(os.environ.get(SHM_ENV, ""))
            return
        time.sleep(poll_s)
    if lone_death(stub_pid, server_pid, server_start, Path(state_dir)) and repo:
        reap(server_pid, server_start, repo, os.environ.get(SHM_ENV, ""))


def lone_death(stub_pid: int, server_pid: int, server_start: int, state_dir: Path,
               kill: Callable[[int, int], None] = os.kill) -> bool:
    """The stub exited without deregistering (killed, crashed) and no other live stub of its server can see
    it (a one-model instance server): writes the death record and SIGTERMs the server, so it exits and its
    readiness and ports go away, like a pod whose container died. Where a peer stub lives (the single-server
    repository) it acts instead (the orchestrator first). Returns whether this call reported the death."""
    if not is_running(server_pid, server_start) or (state_dir / STOPPING_FILE).exists():
        return False
    entries = read_registry(state_dir)
    mine = [e for e in entries if e.pid == stub_pid and e.server_pid == server_pid]
    if not mine:
        return False                      # deregistered at finalize: an orderly exit
    if any(e.server_pid == server_pid and e.pid != stub_pid and is_running(e.pid, e.start_time) for e in entries):
        return False
    me = StubEntry(os.getpid(), start_time(os.getpid()) or 0, f"guard of {mine[0].model}", mine[0].instance, server_pid)
    if not write_private(state_dir / DEATHS_FILE, death_record(mine[0], me, None, time.time()), exclusive=True):
        return False
    kill(server_pid, signal.SIGTERM)
    return True


if __name__ == "__main__":
    import sys
    if len(sys.argv) == 6 and sys.argv[1] == "reap":
        reap(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
    elif len(sys.argv) == 7 and sys.argv[1] == "guard":
        guard(*(int(a) for a in sys.argv[2:6]), sys.argv[6])
    else:
        sys.exit("usage: python -m trtpd.serving.stub_watch reap SERVER_PID SERVER_START REPO SHM_PREFIX | "
                 "guard STUB_PID STUB_START SERVER_PID SERVER_START STATE_DIR")
