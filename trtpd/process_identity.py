"""Process identity from /proc: a pid together with its start time names one process, so a pid the kernel
reused for another program is never signalled or taken for ours. Used by every piece of host-side process
control (servers, the gateway, the controller, supervisord) and by the processes that record themselves."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path


def proc_stat(pid: int) -> list[str] | None:
    """Fields 3.. of /proc/<pid>/stat (after the command name), or None when there is no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return text[text.rindex(")") + 2:].split()


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat: the process's start time in clock ticks since boot (None: no process)."""
    fields = proc_stat(pid)
    return int(fields[19]) if fields else None


def is_running(pid: int, started: int | None) -> bool:
    """The process `pid` that started at `started` still runs (not reused, not a zombie)."""
    fields = proc_stat(pid)
    return bool(fields) and fields[0] != "Z" and (started is None or int(fields[19]) == started)


def signal_exact(pid: int, started: int | None, sig: int) -> bool:
    """Sends `sig` to the process `pid` only if it is the one that started at `started`. Through a pidfd
    (Linux 5.3+): once opened it names one process, so checking its start time and signalling it cannot race
    with the pid being reused in between (a plain check-then-kill can). Returns whether it was signalled."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except (AttributeError, OSError):      # no pidfds here: check, then kill
        if not is_running(pid, started):
            return False
        try:
            os.kill(pid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False
    try:
        if not is_running(pid, started):
            return False
        signal.pidfd_send_signal(fd, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
    finally:
        os.close(fd)


def stop_process(pid: int, started: int | None, timeout_s: float) -> None:
    """SIGTERM, then SIGKILL at the deadline, each only to the process that started at `started` (signal_exact);
    returns once it is gone (its exit status collected if it is our child)."""
    if not signal_exact(pid, started, signal.SIGTERM):
        return
    deadline = time.monotonic() + timeout_s
    while is_running(pid, started):
        reap(pid)
        if time.monotonic() > deadline:
            signal_exact(pid, started, signal.SIGKILL)
            deadline = float("inf")
        time.sleep(0.05)
    reap(pid)


def reap(pid: int) -> None:
    """Collects a child's exit status (no zombie left); nothing for a process that is not our child."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def write_state_file(path: "str | os.PathLike", host: str, port: int) -> None:
    """A server's own record of itself (pid, start time, address), written atomically once its port is bound
    (the gateway's, which its supervisor may restart under a new pid: trtpd/fleet/gateway_process.py reads it; a
    trtllm-serve twin worker's)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "start_time": start_time(os.getpid()), "host": host,
                               "port": port}))
    os.replace(tmp, path)
