"""Process identity from /proc: a pid together with its start time names one process, so a pid the kernel
reused for another program is never signalled or taken for ours. Used by every piece of host-side process
control (servers, the gateway, the controller, supervisord) and by the processes that record themselves."""

from __future__ import annotations

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
