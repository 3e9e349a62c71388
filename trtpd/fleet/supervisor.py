"""A deployment's long-lived processes (its gateway, and its controller when it has one) run under
supervisord, which restarts each one that dies.

Why supervisord: the deployment's own processes need a parent that outlives `trtpd up` and restarts them
at once, with backoff when one keeps crashing at start, rotated logs and an orderly stop; that is what
supervisord does, and has done for years, in pure Python from PyPI (no root, no systemd in a container).
trtpd renders its config (0600, in the deployment's folder, no control socket: nothing else can drive it),
starts it in its own session, and stops it by pid and start time. On Kubernetes the platform restarts the
pods instead (restartPolicy), and this module is not used.

When the deployment has a controller, every death and restart lands in its audit log through an event listener
(`python -m trtpd.controller.supervisor_events`, trtpd/controller/supervisor_events.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from trtpd.errors import TrtpdError
from trtpd.process_identity import start_time, stop_process

CONF_FILE = "supervisord.conf"
LOG_FILE = "supervisord.log"
PID_FILE = "supervisord.pid"
START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Program:
    """One supervised process."""

    name: str                          # gateway | controller
    argv: list[str]
    log_path: Path
    priority: int = 100                # lower starts first and stops last
    env: dict[str, str] = field(default_factory=dict)


def render_conf(name: str, folder: Path, programs: list[Program], listener: list[str] | None) -> str:
    """supervisord's config: no control socket, logs in the deployment's folder, restart on any death but a
    clean exit (a program stopped with SIGTERM exits 0 and stays stopped)."""
    lines = ["[supervisord]", "nodaemon=true", f"identifier=trtpd-{name}", f"logfile={folder / LOG_FILE}",
             *([f"user={_user_name()}"] if os.geteuid() == 0 else []),   # no "running as root" warning
             "logfile_maxbytes=5MB", "logfile_backups=2", f"pidfile={folder / PID_FILE}",
             f"childlogdir={folder}", "loglevel=info", "minfds=1024", ""]
    for p in programs:
        lines += [f"[program:{p.name}]", f"command={_quote(p.argv)}", f"priority={p.priority}", "autostart=true",
                  "autorestart=unexpected", "exitcodes=0", "startsecs=1", "startretries=100",
                  "stopsignal=TERM", "stopwaitsecs=15", "stopasgroup=true", "killasgroup=true",
                  "redirect_stderr=true", f"stdout_logfile={p.log_path}", "stdout_logfile_maxbytes=20MB",
                  "stdout_logfile_backups=2"]
        if p.env:
            lines.append("environment=" + ",".join(f'{k}="{_escape(v)}"' for k, v in p.env.items()))
        lines.append("")
    if listener:
        lines += ["[eventlistener:trtpd_audit]", f"command={_quote(listener)}", "events=PROCESS_STATE",
                  "autorestart=true", "buffer_size=100", f"stderr_logfile={folder / 'events.log'}", ""]
    return "\n".join(lines)


def _user_name() -> str:
    import pwd
    return pwd.getpwuid(os.geteuid()).pw_name


def _escape(value: str) -> str:
    return value.replace("%", "%%").replace('"', '\\"')


def _quote(argv: list[str]) -> str:
    import shlex
    return _escape(" ".join(shlex.quote(a) for a in argv)).replace('\\"', '"')


def start_supervisor(name: str, folder: Path, programs: list[Program], listener: list[str] | None = None) -> dict:
    """Writes the config and starts supervisord in its own session; returns {"pid", "start_time", "conf", "log"}.
    `listener`: the argv of an event listener told of every program's state change (the controller's audit)."""
    folder = Path(folder)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    conf = folder / CONF_FILE
    tmp = conf.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(render_conf(name, folder, programs, listener))
    os.replace(tmp, conf)
    env = {**os.environ, "TRTPD_HOME": os.environ.get("TRTPD_HOME", str(Path(".trtpd").resolve()))}
    with open(folder / "supervisord.out", "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "supervisor.supervisord", "-c", str(conf)], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=env)
    record = {"pid": proc.pid, "start_time": start_time(proc.pid), "conf": str(conf), "log": str(folder / LOG_FILE)}
    # running once it wrote its pidfile (after reading the config, before spawning the programs)
    pidfile, deadline = folder / PID_FILE, time.monotonic() + START_TIMEOUT_S
    while not (pidfile.is_file() and pidfile.read_text().strip() == str(proc.pid)):
        if proc.poll() is not None:
            raise TrtpdError(f"supervisord exited at start (status {proc.returncode}); see {folder / 'supervisord.out'}")
        if time.monotonic() > deadline:
            stop_process(proc.pid, record["start_time"], 5.0)
            raise TrtpdError(f"supervisord did not start within {START_TIMEOUT_S:.0f} s; see {folder / 'supervisord.out'}")
        time.sleep(0.02)
    return record


def stop_supervisor(record: dict | None, timeout_s: float = 30.0) -> None:
    """SIGTERM to supervisord (it stops its programs, highest priority first), then SIGKILL at the deadline."""
    if record and record.get("pid"):
        stop_process(int(record["pid"]), record.get("start_time"), timeout_s)
