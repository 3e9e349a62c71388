"""CPU seconds (user + system, every thread) of processes, read from /proc/<pid>/stat (utime and stime, fields 14
and 15; proc(5)). A process that is gone counts 0 from then on, so measure a set of long-lived processes."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        # the command name (field 2) is parenthesized and may hold spaces: split after its closing parenthesis
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_cpu_s(pid: int) -> float:
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S if fields else 0.0


def cpu_s(pids: Iterable[int]) -> float:
    return sum(process_cpu_s(pid) for pid in pids)


def group_pids(pgids: Iterable[int]) -> list[int]:
    """The processes of these process groups (a server started in its own session and its children)."""
    wanted = set(pgids)
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            fields = _stat_fields(int(d.name))
            if fields and int(fields[2]) in wanted:
                pids.append(int(d.name))
    return pids
