"""Start, wait for and stop the real Triton Inference Server binary that nvidia-pytriton ships.

The python backend's stub embeds Python in isolated mode: it ignores PYTHONPATH and finds its
site-packages from the `python3` first on PATH (reading the pyvenv.cfg next to it), so this
interpreter's bin/ goes first on PATH. The stub is linked against libpython3.X; the interpreter's
own LIBDIR goes first on LD_LIBRARY_PATH, or a system libpython of another patch level is loaded
and ssl-using packages fail (environment.md, python-backend pitfalls 1 and 2).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from trtpd.errors import TrtpdError

SHM_DIR = Path("/dev/shm")
SHM_POOL_BYTES = 64 << 20
SHM_GROWTH_BYTES = 16 << 20
EXIT_TIMEOUT_S = 3


class ServerError(TrtpdError):
    """tritonserver failed to start or stop."""


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


def free_port(host: str = "127.0.0.1") -> int:
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

    def admin_headers(self, protocol: str = "http") -> dict[str, str]:
        from trtpd.serving.server_guard import admin_headers
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

    def is_alive(self) -> bool:
        """Our tritonserver still runs: the pid exists, is no zombie and started when ours did."""
        from trtpd.serving.stub_watch import is_running
        return is_running(self.pid, self.start_time or None)

    def pid_reused(self) -> bool:
        """The pid now belongs to another process (its start time differs from ours)."""
        from trtpd.serving.stub_watch import start_time
        now = start_time(self.pid)
        return bool(self.start_time) and now is not None and now != self.start_time

    def is_ready(self, timeout_s: float = 1.0) -> bool:
        return _answers_200(f"http://{self.http_url}/v2/health/ready", timeout_s)

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
    from trtpd.serving import server_guard
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    state_dir.chmod(0o700)     # repository, keys, logs, deployment.json: the owner's only
    admin_key_file = state_dir / server_guard.ADMIN_KEY_FILE
    admin_key = load_or_create_key_file(admin_key_file)
    backends = prepare_backend_dir(state_dir)
    ports = ports or ServerPorts.pick(host)
    for name, port in asdict(ports).items():
        if not port_is_free(port, host):
            raise ServerError(f"{name} port {port} on {host} is in use; pick another or omit it to choose a free one")
    log_path = Path(log_path or state_dir / "tritonserver.log")
    shm_prefix = f"trtpd{ports.http}_"
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
    from trtpd.serving.stub_watch import start_time
    return ServerProcess(proc.pid, host, ports, str(Path(repo).resolve()), str(log_path), shm_prefix,
                         str(admin_key_file), start_time(proc.pid) or 0)


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
            raise ServerError(f"tritonserver exited during startup; last log lines ({server.log_path}):\n"
                              f"{log_tail(server.log_path)}")
        time.sleep(poll_s)
    raise ServerError(f"tritonserver not ready after {timeout_s:.0f} s; last log lines ({server.log_path}):\n"
                      f"{log_tail(server.log_path)}")


def stop_server(server: ServerProcess, timeout_s: float = 30.0) -> None:
    """SIGTERM, wait for exit (python stubs shut down cleanly), SIGKILL the group if it hangs; then SIGKILL
    (by pid) any stub of its repository still there and remove its /dev/shm files. A pid that is no longer
    this server (start time differs) is never signalled."""
    from trtpd.serving.stub_watch import kill_and_wait, leftover_stubs
    if server.is_alive():
        try:
            os.kill(server.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + timeout_s
        while server.is_alive() and time.monotonic() < deadline:
            _reap(server.pid)
            time.sleep(0.1)
        if server.is_alive():
            try:
                os.killpg(server.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _reap(server.pid)
    _reap(server.pid)
    kill_and_wait(leftover_stubs(server.repo, server.start_time))
    for leftover in SHM_DIR.glob(f"{server.shm_prefix}*"):
        leftover.unlink(missing_ok=True)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
