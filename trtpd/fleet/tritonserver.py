"""Start, wait for and stop the real Triton Inference Server binary that nvidia-pytriton ships.

The python backend's stub embeds Python in isolated mode: it ignores PYTHONPATH and finds its
site-packages from the `python3` first on PATH (reading the pyvenv.cfg next to it), so this
interpreter's bin/ goes first on PATH. The stub is linked against libpython3.X; the interpreter's
own LIBDIR goes first on LD_LIBRARY_PATH, or a system libpython of another patch level is loaded
and ssl-using packages fail (environment.md, python-backend pitfalls 1 and 2).
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar

from trtpd.errors import TrtpdError

SHM_DIR = Path("/dev/shm")
SHM_POOL_BYTES = 64 << 20
SHM_GROWTH_BYTES = 16 << 20
EXIT_TIMEOUT_S = 3
START_ATTEMPTS = 2        # a start-up that crashed, or lost a port it was given, is tried once more
PORT_TAKEN = "already in use"      # tritonserver's words when it cannot listen on a port
LISTEN_PORTS_LOW = 20000           # ports trtpd picks lie from here up to just below the kernel's ephemeral range
log = logging.getLogger(__name__)
S = TypeVar("S")     # a started server: ServerProcess, or a fleet's InstanceRecord


class ServerError(TrtpdError):
    """tritonserver failed to start or stop."""


class ServerStartError(ServerError):
    """tritonserver exited while starting. `returncode`: how (negative: the signal that killed it; None when
    this process did not start it); `log_text`: what this start wrote to its log."""

    def __init__(self, message: str, returncode: int | None = None, log_text: str = "") -> None:
        super().__init__(message)
        self.returncode = returncode
        self.log_text = log_text


def start_retry_reason(returncode: int | None, log_text: str, ports_picked: bool) -> str | None:
    """Why a start-up that failed is worth one more try, or None: a configuration error (a model that does not
    load, a port the user named that is taken) fails the same way again and is reported at once.
    - it crashed (killed by a signal): the python backend of this Triton release aborts now and then while
      its stubs start (boost::interprocess::lock_exception, upstream triton-inference-server/server#8882);
    - a port picked for it (`ports_picked`) was taken by another program before tritonserver listened on it."""
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"it crashed ({name})"
    if ports_picked and PORT_TAKEN in log_text:
        return "a port picked for it was taken before it could listen on it"
    return None


def pytriton_dir() -> Path:
    try:
        import pytriton
    except ImportError:
        raise ServerError("nvidia-pytriton is not installed; run scripts/setup.sh") from None
    return Path(pytriton.__file__).parent / "tritonserver"


def tritonserver_binary() -> Path:
    path = pytriton_dir() / "bin" / "tritonserver"
    if not path.is_file():
        raise ServerError(f"{path} not found; reinstall nvidia-pytriton==0.7.0")
    return path


def prepare_backend_dir(state_dir: Path) -> Path:
    """A backend folder holding the python backend and the stub for this Python version (idempotent)."""
    src = pytriton_dir()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = src / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise ServerError(f"no python backend stub for Python {version} in nvidia-pytriton ({stub})")
    dst = Path(state_dir) / "backends" / "python"
    dst.mkdir(parents=True, exist_ok=True)
    for path in (src / "backends" / "python" / "libtriton_python.so",
                 src / "backends" / "python" / "triton_python_backend_utils.py", stub):
        target = dst / path.name
        if not target.exists() or target.stat().st_size != path.stat().st_size:
            shutil.copy2(path, target)
    return dst.parent


def server_env() -> dict[str, str]:
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    libdirs = [sysconfig.get_config_var("LIBDIR") or "", str(pytriton_dir().parent.parent / "nvidia_pytriton.libs")]
    env["LD_LIBRARY_PATH"] = os.pathsep.join([d for d in libdirs if d] + [env.get("LD_LIBRARY_PATH", "")]).rstrip(os.pathsep)
    env.pop("PYTHONPATH", None)
    return env


def ephemeral_port_range() -> tuple[int, int]:
    """The ports the kernel hands out by itself (outgoing connections, bind to port 0)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999        # Linux's default


def listen_port_candidates(ephemeral: tuple[int, int]) -> range | None:
    """Where trtpd picks the ports its servers listen on: outside the ephemeral range, so no connection the
    kernel makes meanwhile (a client's, a stub's) takes a port between its pick and the server's bind (the
    server binds seconds later, once its models loaded). None: the range leaves no room below it."""
    low, high = LISTEN_PORTS_LOW, ephemeral[0] - 1
    return range(low, high + 1) if high - low >= 1000 else None


def _bindable(port: int, host: str) -> bool:
    with socket.socket() as s:      # (no SO_REUSEADDR: a port with connections in TIME_WAIT counts as taken)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, picked at random outside the kernel's ephemeral range
    (listen_port_candidates); the kernel's own pick where that range leaves no room."""
    candidates = listen_port_candidates(ephemeral_port_range())
    for _ in range(100 if candidates else 0):
        port = candidates[secrets.randbelow(len(candidates))]
        if _bindable(port, host):
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


@dataclass
class ServerPorts:
    http: int
    grpc: int
    metrics: int

    @classmethod
    def pick(cls, host: str = "127.0.0.1") -> "ServerPorts":
        ports: set[int] = set()
        while len(ports) < 3:
            ports.add(free_port(host))
        http, grpc, metrics = sorted(ports)
        return cls(http, grpc, metrics)


@dataclass
class ServerProcess:
    pid: int
    host: str
    ports: ServerPorts
    repo: str
    log_path: str
    shm_prefix: str
    admin_key_file: str = ""      # secret for Triton's restricted APIs (server_guard.admin_headers)
    start_time: int = 0           # field 22 of /proc/<pid>/stat at start: a reused pid is not ours (0: unknown)
    ready_path: str = "/v2/health/ready"   # what answers 200 once it serves (a trtllm-serve worker's: /health)

    def admin_headers(self, protocol: str = "http") -> dict[str, str]:
        from trtpd.fleet.server_guard import admin_headers
        return admin_headers(self.admin_key_file, protocol)

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.ports.http}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.ports.grpc}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.ports.metrics}/metrics"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ServerProcess":
        return cls(**{**d, "ports": ServerPorts(**d["ports"])})

    def exit_status(self) -> int | None:
        """How the tritonserver this process started ended: its return code (negative: the signal that killed
        it); None while it runs, or when another process started it."""
        popen = getattr(self, "_popen", None)      # (set by start_server; not a field, never saved)
        return None if popen is None else popen.poll()

    def log_since_start(self) -> str:
        """What this start of the server wrote to its log (the log file is appended to by every start)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(getattr(self, "_log_offset", 0))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def is_alive(self) -> bool:
        """Our tritonserver still runs: the pid exists, is no zombie and started when ours did."""
        from trtpd.process_identity import is_running
        return is_running(self.pid, self.start_time or None)

    def pid_reused(self) -> bool:
        """The pid now belongs to another process (its start time differs from ours)."""
        from trtpd.process_identity import start_time
        now = start_time(self.pid)
        return bool(self.start_time) and now is not None and now != self.start_time

    def is_ready(self, timeout_s: float = 1.0) -> bool:
        return _answers_200(f"http://{self.http_url}{self.ready_path}", timeout_s)

    def metrics_ready(self, timeout_s: float = 1.0) -> bool:
        """The metrics endpoint answers: tritonserver starts it after the HTTP endpoint, so a server can say
        ready a moment before its metrics (which the gateway and the controller read) can be read."""
        return _answers_200(self.metrics_url, timeout_s)


def _answers_200(url: str, timeout_s: float) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def log_tail(path: str | Path, num_lines: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-num_lines:])
    except FileNotFoundError:
        return "(no log)"


def start_server(repo: Path, state_dir: Path, *, host: str = "127.0.0.1", ports: ServerPorts | None = None,
                 log_path: Path | None = None, extra_args: list[str] | None = None,
                 cpus: list[int] | None = None) -> ServerProcess:
    """Starts tritonserver in the background (its own session) and returns without waiting. `cpus`: the
    cores it may run on (sched_setaffinity before exec, so its python stubs inherit them)."""
    from trtpd.kv.handle import load_or_create_key_file
    from trtpd.fleet import server_guard
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    state_dir.chmod(0o700)     # repository, keys, logs, fleet.json: the owner's only
    admin_key_file = state_dir / server_guard.ADMIN_KEY_FILE
    admin_key = load_or_create_key_file(admin_key_file)
    backends = prepare_backend_dir(state_dir)
    ports = ports or ServerPorts.pick(host)
    for name, port in asdict(ports).items():
        if not port_is_free(port, host):
            raise ServerError(f"{name} port {port} on {host} is in use; pick another or omit it to choose a free one")
    log_path = Path(log_path or state_dir / "tritonserver.log")
    # the port tells whose files they are; the token keeps them apart from those of an earlier server that had
    # the same port, whose cleanup (stop_server, a stub's guard) may still be running
    shm_prefix = f"trtpd{ports.http}_{secrets.token_hex(3)}_"
    cmd = [str(tritonserver_binary()), f"--model-repository={Path(repo).resolve()}",
           f"--backend-directory={backends}", f"--http-address={host}", f"--grpc-address={host}",
           f"--metrics-address={host}", f"--http-port={ports.http}", f"--grpc-port={ports.grpc}",
           f"--metrics-port={ports.metrics}", "--disable-auto-complete-config",
           f"--backend-config=python,shm-region-prefix-name={shm_prefix}",
           # Start each stub's shared-memory pool large enough that it never grows under load: growing it
           # while several BLS requests are in flight crashes the python backend of this Triton release.
           f"--backend-config=python,shm-default-byte-size={SHM_POOL_BYTES}",
           f"--backend-config=python,shm-growth-byte-size={SHM_GROWTH_BYTES}",
           "--metrics-config=summary_latencies=true", "--log-verbose=0",
           # a stopping server waits this long for in-flight requests (a dead stub's never end), not 30 s
           f"--exit-timeout-secs={EXIT_TIMEOUT_S}", *(extra_args or [])]
    log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.fchmod(log_fd, 0o600)
    log_offset = os.fstat(log_fd).st_size
    with os.fdopen(log_fd, "ab") as log:
        log.write(("\n$ " + " ".join(cmd) + " [+ restricted-API flags, hidden]\n").encode())
        log.flush()
        env = server_env()
        env["TRTPD_SHM_PREFIX"] = shm_prefix   # KV pools in /dev/shm carry it, so stop_server cleans them up
        env["TRTPD_STATE_DIR"] = str(state_dir.resolve())   # the stubs' registry and watch (stub_watch.py)
        # the admin secret goes in the environment, not on the command line that every user can read, and
        # the guard keeps the python backend's shared memory 0600 (server_guard.py)
        env = server_guard.hide(env, server_guard.admin_flags(admin_key), state_dir)
        # umask 077: the python backend's shared-memory regions (prompts, handles), the stubs' files and
        # anything else the server creates are 0600, so other local users cannot read them
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=state_dir, start_new_session=True, umask=0o077,
                                preexec_fn=_pin(cpus) if cpus else None)
    from trtpd.process_identity import start_time
    server = ServerProcess(proc.pid, host, ports, str(Path(repo).resolve()), str(log_path), shm_prefix,
                           str(admin_key_file), start_time(proc.pid) or 0)
    server._popen, server._log_offset = proc, log_offset   # its exit status, and where its log begins
    return server


def _pin(cpus: list[int]):
    cores = set(cpus)
    return lambda: os.sched_setaffinity(0, cores)


def wait_ready(server: ServerProcess, timeout_s: float = 120.0, poll_s: float = 0.2) -> None:
    """Until the server says ready and its metrics endpoint answers too."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.is_ready() and server.metrics_ready():
            return
        if not server.is_alive():
            code = server.exit_status()
            how = "" if code is None else (f" (killed by signal {-code})" if code < 0 else f" (exit code {code})")
            raise ServerStartError(f"tritonserver exited during startup{how}; last log lines ({server.log_path}):\n"
                                   f"{log_tail(server.log_path)}", code, server.log_since_start())
        time.sleep(poll_s)
    raise ServerError(f"tritonserver not ready after {timeout_s:.0f} s; last log lines ({server.log_path}):\n"
                      f"{log_tail(server.log_path)}")


def until_ready(first: S, wait: Callable[[S], None], stop: Callable[[S], None], start_again: Callable[[S], S],
                ports_picked: bool, name: Callable[[S], str], attempts: int = START_ATTEMPTS) -> S:
    """Waits (`wait` raises ServerStartError) until `first` is ready. One whose start-up failed for a reason worth
    another try (start_retry_reason) is stopped and replaced by `start_again(it)`, up to `attempts` starts in all;
    the last failure is raised, and the caller stops what it started (the server that failed last included).
    Returns the server that became ready."""
    server = first
    for attempt in range(1, attempts + 1):
        try:
            wait(server)
            return server
        except ServerStartError as exc:
            reason = start_retry_reason(exc.returncode, exc.log_text, ports_picked)
            if reason is None or attempt == attempts:
                raise
            log.warning("%s failed to start: %s; starting it again (%d of %d)", name(server), reason, attempt + 1,
                        attempts)
        stop(server)        # its stubs and /dev/shm files
        server = start_again(server)
    raise AssertionError("unreachable")


def start_until_ready(start: Callable[[ServerPorts | None], ServerProcess], ports: ServerPorts | None = None,
                      timeout_s: float = 120.0, attempts: int = START_ATTEMPTS) -> ServerProcess:
    """`start(ports)` and until_ready (with `ports` None, each start picks its own); on any failure the server
    started last is stopped before the error is raised."""
    started = [start(ports)]

    def start_again(_: ServerProcess) -> ServerProcess:
        started.append(start(ports))
        return started[-1]
    try:
        return until_ready(started[0], lambda server: wait_ready(server, timeout_s), stop_server, start_again,
                           ports is None, lambda server: f"tritonserver (pid {server.pid}, log {server.log_path})",
                           attempts)
    except BaseException:
        stop_server(started[-1])
        raise


def stop_server(server: ServerProcess, timeout_s: float = 30.0) -> None:
    """SIGTERM, wait for exit (python stubs shut down cleanly), SIGKILL the group if it hangs; then SIGKILL
    (by pid) any stub of its repository still there, remove its /dev/shm files and end the stubs' guard and
    reaper processes (a guard notices its stub's exit only at its next poll). A pid that is no longer
    this server (start time differs) is never signalled."""
    from trtpd.process_identity import signal_exact
    from trtpd.serving.stub_watch import kill_and_wait, leftover_helpers, leftover_stubs
    if signal_exact(server.pid, server.start_time or None, signal.SIGTERM):
        deadline = time.monotonic() + timeout_s
        while server.is_alive() and time.monotonic() < deadline:
            _reap(server)
            time.sleep(0.1)
        if server.is_alive():
            try:
                os.killpg(server.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _reap(server)
    _reap(server)
    kill_and_wait(leftover_stubs(server.repo, server.start_time))
    for leftover in SHM_DIR.glob(f"{server.shm_prefix}*"):
        leftover.unlink(missing_ok=True)
    if server.start_time:               # the stubs' guards and a reaper: their work is done above
        kill_and_wait(leftover_helpers(server.pid, server.start_time))


def _reap(server: ServerProcess) -> None:
    """Collects the exit status of a server this process started (no zombie is left)."""
    if getattr(server, "_popen", None) is not None:
        server.exit_status()
        return
    try:
        os.waitpid(server.pid, os.WNOHANG)
    except ChildProcessError:
        pass
