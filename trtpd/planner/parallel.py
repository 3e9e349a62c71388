"""Two independent computations at once: one in a forked child process, one here.

The planner's simulations are independent of each other and deterministic (same seeds), so running the
disaggregated side's goodput search beside the colocated one changes no figure, and on a machine with two
cores takes the longer of the two instead of their sum. Where fork is not available, or the child fails
for any reason, the first computation runs here after the second: the same result, later.
"""

from __future__ import annotations

import os
import pickle
import sys
import traceback
from typing import Callable, TypeVar

A = TypeVar("A")
B = TypeVar("B")


def can_fork() -> bool:
    return hasattr(os, "fork") and sys.platform != "darwin" and (os.cpu_count() or 1) > 1


def both(first: Callable[[], A], second: Callable[[], B], parallel: bool = True) -> tuple[A, B]:
    """(first(), second()); with parallel and fork, first() runs in a child process while second() runs
    here. first()'s result must pickle; neither may rely on the other's side effects."""
    if not (parallel and can_fork()):
        return first(), second()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:                                  # the child: compute, send, leave without cleanup
        os.close(read_fd)
        try:
            data = pickle.dumps(("ok", first()), protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException:                     # noqa: BLE001 (reported to the parent, which recomputes)
            data = pickle.dumps(("error", traceback.format_exc()))
        with os.fdopen(write_fd, "wb") as out:
            out.write(data)
        os._exit(0)
    os.close(write_fd)
    try:
        b = second()
    finally:
        with os.fdopen(read_fd, "rb") as inp:
            data = inp.read()
        os.waitpid(pid, 0)
    try:
        status, a = pickle.loads(data)
    except Exception:                             # noqa: BLE001 (a child killed before it wrote)
        status, a = "error", None
    if status != "ok":
        a = first()
    return a, b
